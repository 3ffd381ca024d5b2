"""Generate the blocking twins from their asyncio sources, by words alone.

    python scripts/unasync.py          write every generated file
    python scripts/unasync.py --check  exit 1, naming the files, if any differs

Each pair in FILES is written once, as asyncio code; its blocking twin is that code with
``async``/``await`` taken out and the names in SUBSTITUTIONS swapped, line by line. What
differs beyond that (threads or tasks, locks, sleeping, bounding a call) lives in the two
backend modules, ``_async.backend`` and ``_sync.backend``, under the same names, so the
generated code imports the blocking one. The test suite runs ``--check``.

Code only the asyncio side has (running a coroutine under a lease, cancelling a task when
its lease is lost, catching a cancellation) is marked in its source, and left out of the
twin:

    self._cancel_on_lost = flag  # unasync: async only       (this line)

    # unasync: async only                                    (these lines, markers too)
    async def using(...): ...
    # unasync: end

Docstrings say what holds for asyncio alone in a sentence that starts "asyncio:" (or
"asyncio only:"), or in a parenthesis that does ("(asyncio: the task)", "(and asyncio's
...)", "(the thread; asyncio: the task)"): the twin's docstrings leave those words out.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "redlease"

# (asyncio source, blocking twin), relative to the package
FILES = [
    ("_async/conn.py", "_sync/conn.py"),
    ("_async/io.py", "_sync/io.py"),
    ("_async/front.py", "_sync/front.py"),
    ("_async/lock.py", "_sync/lock.py"),
    ("_async/semaphore.py", "_sync/semaphore.py"),
    ("_async/rwlock.py", "_sync/rwlock.py"),
    ("_async/election.py", "_sync/election.py"),
    ("_async/multilock.py", "_sync/multilock.py"),
    ("_async/redlock.py", "_sync/redlock.py"),
    ("_async/inspect.py", "_sync/inspect.py"),
    ("sql/_async.py", "sql/_sync.py"),
    ("_async/fenced.py", "_sync/fenced.py"),
    ("_async/once.py", "_sync/once.py"),
]

# Whole words (or the exact text, for the ones starting with punctuation), in order.
SUBSTITUTIONS = [
    ("async def", "def"),
    ("async with", "with"),
    ("await ", ""),
    ("StopAsyncIteration", "StopIteration"),
    ("__aenter__", "__enter__"),
    ("__aexit__", "__exit__"),
    ("__anext__", "__next__"),
    ("__aiter__", "__iter__"),
    ("_async.backend", "_sync.backend"),
    ("aread_info", "read_info"),
    ("afence_gate", "fence_gate"),
    ("afenced_update", "fenced_update"),
    ("acreate_table", "create_table"),
    ("agated_execute", "gated_execute"),
]
# Then: any other ``AsyncX`` is ``X`` (``_AsyncX``, ``_X``).
_CLASS = re.compile(r"(?<![^\W_])(_?)Async([A-Z]\w*)")

ASYNC_ONLY = "# unasync: async only"
END = "# unasync: end"

_PATTERNS = [
    (
        re.compile(
            (r"(?<!\w)" if old[0].isalnum() else "")
            + re.escape(old)
            + (r"\b" if old[-1].isalnum() else "")
        ),
        new,
    )
    for old, new in SUBSTITUTIONS
]
# Awaitable[X] and Coroutine[Any, Any, X] are X; an import of Awaitable goes
_AWAITABLE = re.compile(r"\b(?:Awaitable\[|Coroutine\[Any, Any, )(\w+(?: \| \w+)*)\]")
_AWAITABLE_IMPORT = re.compile(r"\bAwaitable, ")


def header(source: str) -> str:
    return (
        f"# Generated from {source} by scripts/unasync.py: edit that file, then run\n"
        "# `python scripts/unasync.py` (the tests run it with --check).\n"
    )


def unasync_line(line: str) -> str:
    for pattern, new in _PATTERNS:
        line = pattern.sub(new, line)
    line = _CLASS.sub(r"\1\2", line)
    line = _AWAITABLE.sub(r"\1", line)
    if line.startswith(("from collections.abc import", "from typing import")):
        line = _AWAITABLE_IMPORT.sub("", line)
    return line


def _ruff(args: list[str], text: str, target: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(PACKAGE / target), "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {args[0]} failed on the generated {target}:\n{done.stderr}")
    return done.stdout


def both_sides(lines: list[str], source: str) -> list[str]:
    """The lines without those marked asyncio only. A marked line must be a whole
    statement: one that ruff has split carries its mark on its last line only."""
    kept, inside = [], 0
    for number, line in enumerate(lines, start=1):
        mark = line.strip()
        if mark == ASYNC_ONLY:
            if inside:
                raise SystemExit(f"{source}:{number}: async-only block inside another")
            inside = number
        elif mark == END:
            if not inside:
                raise SystemExit(f"{source}:{number}: {END!r} without {ASYNC_ONLY!r}")
            inside = 0
        elif not inside and not line.rstrip().endswith(ASYNC_ONLY):
            kept.append(line)
        elif not inside and line.lstrip().startswith((")", "]", "}")):
            raise SystemExit(f"{source}:{number}: mark a split statement as a block")
    if inside:
        raise SystemExit(f"{source}:{inside}: async-only block never ends")
    return kept


# What a docstring says of asyncio alone, in the words the sources use for it: a
# sentence that starts "asyncio:" or "asyncio only:", a parenthesis that does ("(asyncio:
# ...)", "(and asyncio's ...)"), and the "; asyncio: ..." end of one. The twin's
# docstrings leave these out (and their paragraphs are filled again).
_ASYNC_SENTENCE = re.compile(r"(?:(?<=\. )|(?<=^))asyncio(?: only)?: [^.]*?\.(?: |$)", re.M)
_ASYNC_ASIDE = re.compile(r" ?\((?:and )?asyncio(?::|'s)[^()]*\)")
_ASYNC_TAIL = re.compile(r"; asyncio: [^()]*(?=\))")
_FILL = 88  # the docstrings' width


def _without_asyncio(flat: str) -> str:
    flat = _ASYNC_TAIL.sub("", flat)
    flat = _ASYNC_ASIDE.sub("", flat)
    return _ASYNC_SENTENCE.sub("", flat).strip()


def blocking_docstring(body: str, indent: str) -> str:
    """A docstring's body with its asyncio-only words left out, each paragraph that had
    some filled again at the docstrings' width (one that had nothing else goes); lists,
    code and untouched paragraphs are kept as they are."""
    parts = re.split(r"(\n[ \t]*\n)", body)  # paragraph, blank line, paragraph...
    out = ""
    for at in range(0, len(parts), 2):
        paragraph, blank = parts[at], parts[at - 1] if at else ""
        trail = paragraph[len(paragraph.rstrip()) :]  # (before the closing quotes)
        flat = " ".join(paragraph.split())
        listed = any(ln.lstrip().startswith(("* ", "- ", ">>>")) for ln in paragraph.split("\n"))
        new = flat if listed else _without_asyncio(flat)
        if new == flat:
            out += blank + paragraph
        elif new:
            first = at == 0  # it starts after the opening quotes
            filled = textwrap.fill(
                new,
                width=_FILL,
                initial_indent=" " * (len(indent) + 3) if first else indent,
                subsequent_indent=indent,
                break_long_words=False,
                break_on_hyphens=False,
            )
            out += blank + (filled.lstrip() if first else filled) + trail
        else:  # nothing left of it
            out += trail if at == len(parts) - 1 else ""
    return out


def _blocking_docstrings(text: str) -> str:
    """Every docstring of ``text`` as the blocking twin says it (``blocking_docstring``)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    lines = text.splitlines(True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    edits = []
    for token in tokens:
        if token.type != tokenize.STRING or not token.string.startswith('"""'):
            continue
        if "asyncio" not in token.string:
            continue
        (row, col), (end_row, end_col) = token.start, token.end
        start, end = offsets[row - 1] + col, offsets[end_row - 1] + end_col
        indent = " " * col
        body = token.string[3:-3]
        edits.append((start, end, '"""' + blocking_docstring(body, indent) + '"""'))
    for start, end, new in reversed(edits):
        text = text[:start] + new + text[end:]
    return text


def generate(source: str, target: str) -> str:
    lines = both_sides((PACKAGE / source).read_text().splitlines(True), source)
    text = header(source) + "".join(unasync_line(line) for line in lines)
    text = _blocking_docstrings(text)
    text = _ruff(["check", "--select", "I,F401", "--fix", "--quiet"], text, target)
    return _ruff(["format", "--quiet"], text, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for source, target in FILES:
        wanted = generate(source, target)
        path = PACKAGE / target
        if path.exists() and path.read_text() == wanted:
            continue
        if args.check:
            stale.append(target)
        else:
            path.write_text(wanted)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(
            "out of date with their asyncio sources (run `python scripts/unasync.py`): "
            + ", ".join(stale),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
