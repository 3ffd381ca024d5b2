"""The documentation: it cites no file outside the repository, its relative links lead to
files that exist, the API reference covers every public name, the examples marked
runnable run against a real server, and the site builds with ``mkdocs build --strict``.

(That the design page's module map names every module is tests/unit/test_layout.py's.)
"""

from __future__ import annotations

import ast
import html
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

import redlease
import redlease.sql
from redlease._rules.keys import DEFAULT_PREFIX
from redlease.tools import servers

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
# every Markdown file of the repository (not of its virtual environments or caches)
_REPO_MD = [
    path.relative_to(ROOT).as_posix()
    for path in ROOT.rglob("*.md")
    if not any(part.startswith(".") for part in path.relative_to(ROOT).parts)
]

# [text](target), ![alt](target), <a href="target">, <img src="target">, [ref]: target
_LINK = re.compile(
    r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
    r"|(?:href|src)=\"([^\"]+)\""
    r"|^\s*\[[^\]]+\]:\s*(\S+)",
    re.MULTILINE,
)
# a file name ending in .md, with the folders before it (SPEC.md, ../shared/STYLE.md...)
_MD_MENTION = re.compile(r"(?<![\w/.-])((?:\.{1,2}/)*[\w./-]*\w\.md)\b")
# places where a checkout, a home directory or scratch files live: never the repository's
_OUTSIDE = re.compile(r"(?<![\w.~-])/(?:work|home|Users|root|tmp|mnt|shared)(?:/|\b)")


def _relative(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _resolves_inside(base: Path, target: str) -> bool:
    path = (base / unquote(target)).resolve()
    return path.is_relative_to(ROOT) and path.exists()


def test_the_pages_are_found() -> None:
    names = {_relative(page) for page in PAGES}
    assert {"README.md", "docs/design.md", "docs/getting-started.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_relative_links_lead_to_files_in_the_repository(page: Path) -> None:
    broken = []
    for match in _LINK.finditer(page.read_text()):
        target = next(group for group in match.groups() if group)
        parts = urlsplit(target)
        if parts.scheme or parts.netloc or not parts.path:  # a web address, or "#anchor"
            continue
        if parts.path.startswith("/") or not _resolves_inside(page.parent, parts.path):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_no_page_cites_a_file_outside_the_repository(page: Path) -> None:
    text = page.read_text()
    unknown = [
        mention
        for mention in _MD_MENTION.findall(text)
        # a mention names a file in the repository: relative to the page, or a path
        # (or a plain file name) that a file of the repository ends with
        if not _resolves_inside(page.parent, mention)
        and (
            mention.startswith("../")
            or not any(p == mention or p.endswith(f"/{mention}") for p in _REPO_MD)
        )
    ]
    outside = [match.group(0) for match in _OUTSIDE.finditer(text)]
    assert unknown == []
    assert outside == []


def _split_tables(text: str) -> list[int]:
    """Lines (1-based, outside code blocks) where rows of a table begin without being a
    table: not after a blank line (Markdown reads them as the paragraph's text), or not
    followed by the header's |---| line (rows cut off from their table by a paragraph or
    a blank line)."""
    found, fenced, previous = [], False, ""
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced = not fenced
        follows = lines[number] if number < len(lines) else ""
        begins = not fenced and line.startswith("|") and not previous.startswith("|")
        if begins and (previous.strip() or not re.match(r"\|\s*:?-", follows)):
            found.append(number)
        previous = line
    return found


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_no_table_is_cut_in_two(page: Path) -> None:
    assert _split_tables(page.read_text()) == []


def test_the_checks_catch_what_they_are_for() -> None:
    assert _MD_MENTION.findall("see SPEC.md and ../shared/STYLE.md") == [
        "SPEC.md",
        "../shared/STYLE.md",
    ]
    assert _MD_MENTION.findall("[x](docs/design.md), `benchmarks.md`") == [
        "docs/design.md",
        "benchmarks.md",
    ]
    assert _OUTSIDE.findall("cat /work/shared/BENCH.md; ls /home/me /tmp") != []
    assert _OUTSIDE.findall("/etc/cron.d/report, /srv/app/.venv/bin/redlease") == []
    assert _split_tables("| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n") == [5]
    assert _split_tables("| a |\n|---|\n| 1 |\n\ntext\n| 2 |\n") == [6]
    assert _split_tables("| a |\n|---|\n\n| b |\n|---|\n") == []  # two tables
    assert not _resolves_inside(DOCS, "../../shared/STYLE.md")
    assert _resolves_inside(DOCS, "../README.md")


def test_the_reference_covers_every_public_name() -> None:
    text = "\n".join(path.read_text() for path in sorted((DOCS / "reference").glob("*.md")))
    documented = set(re.findall(r"^::: redlease\.(\w+)\s*$", text, re.MULTILINE))
    assert sorted(set(redlease.__all__) - documented - {"__version__"}) == []
    gate = set(re.findall(r"^::: redlease\.sql\.(\w+)\s*$", text, re.MULTILINE))
    assert sorted(set(redlease.sql.__all__) - gate - {"StaleFence"}) == []
    assert "redlease.__version__" in text


def test_every_name_the_reference_defines_is_importable() -> None:
    """What the reference shows as ``redlease.X`` (a heading, an anchor) is reached from
    ``import redlease`` alone, attribute by attribute."""
    text = "\n".join(path.read_text() for path in sorted((DOCS / "reference").glob("*.md")))
    shown = set(re.findall(r"^::: (redlease(?:\.\w+)+)\s*$", text, re.MULTILINE))
    shown |= set(re.findall(r'id="(redlease(?:\.\w+)+)"', text))
    assert "redlease.Lock" in shown
    unreachable = []
    for dotted in sorted(shown):
        found: Any = redlease
        for part in dotted.split(".")[1:]:
            found = getattr(found, part, _MISSING)
            if found is _MISSING:
                unreachable.append(dotted)
                break
    assert unreachable == []


_MISSING = object()


# -- runnable examples ------------------------------------------------------------------

# A page marks an example it promises runs as shown with this comment on the line before
# its fence; the examples talk to a default client (localhost:6379), pointed here at the
# test session's server.
_RUNNABLE = re.compile(r"^<!-- docs-test: run -->\n```python\n(.*?)^```$", re.DOTALL | re.M)


def _examples() -> list[tuple[str, str]]:
    return [
        (f"{_relative(page)}#{number}", code)
        for page in PAGES
        for number, code in enumerate(_RUNNABLE.findall(page.read_text()), start=1)
    ]


def test_the_guides_have_runnable_examples() -> None:
    pages = {name.split("#")[0] for name, _ in _examples()}
    assert {"docs/getting-started.md", "docs/guides/fencing.md"} <= pages


@pytest.mark.slow
@pytest.mark.parametrize(("name", "code"), _examples(), ids=[name for name, _ in _examples()])
def test_the_runnable_examples_run(name: str, code: str, server: servers.ServerProcess) -> None:
    for client in ("redis.Redis", "redis.asyncio.Redis"):
        code = code.replace(f"{client}()", f"{client}(port={server.port})")
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}"


# -- the site ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings")),
    reason="mkdocs-material and mkdocstrings are not installed",
)
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "reference" / "lock" / "index.html").exists()
    _the_signatures_name_what_the_reference_defines(tmp_path / "reference")


# Names a signature may show that the reference does not define: Python's, the typing
# module's, and the types of the libraries a caller brings (a client, a meter provider).
_FOREIGN = {"Any", "Awaitable", "Callable", "Coroutine", "Iterable", "Mapping", "None", "TypeAlias"}
_FOREIGN |= {"Sequence", "True", "False", "MeterProvider", "Redis", "RedisCluster"}
# The type variables of generic signatures (typing's, not names of the package: the
# reference's Types section says what each stands for).
_TYPE_VARIABLES = {"P", "R"}
# Gaps the reference still has (none now: a name that must wait goes here, with why).
_NOT_YET: set[str] = set()


def _the_signatures_name_what_the_reference_defines(reference: Path) -> None:
    """Every name a signature in the reference shows that is a class, a type or a
    constant (capitalised) is defined on one of its pages; none is private."""
    defined: set[str] = set()
    shown: dict[str, set[str]] = {}
    for page in [*sorted(reference.glob("*/index.html")), reference / "index.html"]:
        text = page.read_text()
        defined |= {
            anchor.rsplit(".", 1)[-1] for anchor in re.findall(r'id="redlease\.([\w.]+)"', text)
        }
        for signature in re.findall(
            r'<div class="doc-signature highlight">(.*?)</div>', text, re.S
        ):
            words = html.unescape(re.sub(r"<[^>]+>", "", signature))
            for word in re.findall(r"\b[A-Za-z_]\w*\b", words):
                if word[0].isupper() or word.startswith("_"):
                    shown.setdefault(word, set()).add(page.parent.name)
    undefined = {word: sorted(pages) for word, pages in shown.items() if word not in defined}
    unexplained = {
        w: p for w, p in undefined.items() if w not in _FOREIGN | _TYPE_VARIABLES | _NOT_YET
    }
    assert unexplained == {}
    assert set(undefined) >= _NOT_YET, "a gap closed: take it off _NOT_YET"


# -- the reference shows real defaults ----------------------------------------------------


def _public_callables() -> list[tuple[str, Any]]:
    found = []
    for name in redlease.__all__:
        obj = getattr(redlease, name)
        if inspect.isclass(obj):
            found += [
                (f"{name}.{attr}", getattr(obj, attr))
                for attr in dir(obj)
                if (attr == "__init__" or not attr.startswith("_"))
                and inspect.isfunction(getattr(obj, attr, None))
            ]
        elif inspect.isfunction(obj):
            found.append((name, obj))
    return found


def test_the_reference_shows_each_default_as_its_value() -> None:
    """The API reference renders a signature as written: a default must be written as its
    value (``prefix="redlease:"``), not a constant's name; and the value must be the one
    the library uses."""
    by_name = []
    for label, function in _public_callables():
        try:
            source = textwrap.dedent(inspect.getsource(function))
        except OSError:  # a dataclass's generated __init__: its fields show as declared
            continue
        tree = ast.parse(source)
        node = tree.body[0]
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        arguments = node.args
        defaults = [*arguments.defaults, *(d for d in arguments.kw_defaults if d is not None)]
        by_name += [
            f"{label}: {ast.unparse(d)}" for d in defaults if not isinstance(d, ast.Constant)
        ]
        prefix = inspect.signature(function).parameters.get("prefix")
        if prefix is not None:
            assert prefix.default == DEFAULT_PREFIX, label
    assert by_name == []


def test_the_readme_is_a_front_page() -> None:
    """A newcomer reads it in five minutes: under 12 KB, the depth in the docs site."""
    assert len((ROOT / "README.md").read_bytes()) < 12 * 1024
