"""The shape of the code: every module on the design page's map, the sync and asyncio
twins with the same names in the same order (those generated from their asyncio source
by ``scripts/unasync.py`` are checked by running it), and no private attribute of another
library touched anywhere in ``src/``."""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src" / "redlease"
DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def test_the_generated_twins_match_their_asyncio_sources() -> None:
    done = subprocess.run(
        [sys.executable, str(SRC.parents[1] / "scripts" / "unasync.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _mapped() -> set[str]:
    """The files and packages the design page's module map lists (the code block after
    "The module map": a tree, two spaces of indent a level, each entry's description
    after it)."""
    block = DESIGN.read_text().split("The module map", 1)[1].split("```")[1]
    found: set[str] = set()
    folders: list[str] = []
    for line in block.splitlines()[1:]:
        entry = line.strip().split(" ")[0] if line.strip() else ""
        if not entry.endswith((".py", "/")):
            continue  # a description's next line
        depth = (len(line) - len(line.lstrip(" "))) // 2
        folders = folders[:depth]
        found.add("".join(folders) + entry)
        if entry.endswith("/"):
            folders.append(entry)
    return found


def test_the_module_map_names_every_module() -> None:
    """The map on the design page lists every module and package, where it is, and
    nothing that is not there."""
    actual = {path.relative_to(SRC).as_posix() for path in SRC.rglob("*.py")}
    actual |= {
        path.parent.relative_to(SRC).as_posix() + "/"
        for path in SRC.rglob("__init__.py")
        if path.parent != SRC
    }
    actual = {path for path in actual if not path.endswith("/__init__.py")}
    assert sorted(actual - _mapped()) == []
    assert sorted(_mapped() - actual) == []


# The layers, lowest first: a module imports modules of its own layer or lower ones (even
# inside a function), and the two flavours never import each other.
_LAYERS = [
    {"_base"},
    {"_rules"},  # (the rules know the foundation alone: no client, no wire)
    {"_clients"},
    {"_wire"},
    {"_async", "_sync"},
    # the public face: redlease itself, redlease.metrics...
    {"", "_public", "_once", "metrics", "sql", "testing"},
    {"_cli", "tools"},
    {"__main__"},
]
# What the rules never import: no I/O, no threads, no tasks.
_NO_IO = {"socket", "select", "selectors", "ssl", "threading", "queue", "asyncio"}


def _layer(module: str) -> tuple[int, str]:
    top = module.split(".")[1] if "." in module else ""
    return next(rank for rank, names in enumerate(_LAYERS) if top in names), top


def test_no_layer_imports_a_higher_one() -> None:
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module_of(path)
        rank, top = _layer(module)
        for imported in sorted(_imports(path)):
            their_rank, their_top = _layer(imported)
            if their_rank > rank or {top, their_top} == {"_async", "_sync"}:
                wrong.append(f"{module} imports {imported}")
    assert wrong == []


def test_the_rules_do_no_io() -> None:
    wrong = []
    for path in sorted((SRC / "_rules").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            wrong += [f"{path.name}: {name}" for name in names if name.split(".")[0] in _NO_IO]
    assert wrong == []


def _public_shape(path: Path) -> tuple[set[str], set[str]]:
    """The public names a module defines at its top level, with its public classes'
    public methods (``Class.method``); and which of the names are classes."""
    names: set[str] = set()
    classes: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        targets: list[ast.expr] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            classes.add(node.name)
            names |= {
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and not item.name.startswith("_")
            }
        elif isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {name for name in names if not name.startswith("_")}, classes


def test_the_two_backends_offer_the_same_names() -> None:
    """The generated code calls the blocking backend by the names its source calls the
    asyncio one: each must have them all. A class on one side may be a plain name on the
    other (a thread lock, say): its methods are then not compared. Only code marked
    asyncio-only uses the rest."""
    (sync, sync_classes), (asyncio, asyncio_classes) = (
        _public_shape(SRC / name) for name in _BACKENDS
    )
    classes_on_both = sync_classes & asyncio_classes
    asyncio_only = {"ClassConnection.shut"}
    differ = {
        name for name in sync ^ asyncio if "." not in name or name.split(".")[0] in classes_on_both
    }
    assert differ - asyncio_only == set()
    assert asyncio_only <= asyncio


_BACKENDS = ("_sync/backend.py", "_async/backend.py")


# The asyncio code not yet generated into a twin, or with no twin: each name says why.
_HAND_WRITTEN = {
    # what differs between the flavours, by design
    "_async/backend.py": {"*"},
    # the renewers, whose designs differ (two threads; one task per loop)
    "_async/renewer.py": {"*"},
    # the misuse guard of every asyncio object
    "_base/misuse.py": {"AsyncOnly"},
}


def _asyncio_names(path: Path) -> set[str]:
    """Classes named Async*, and `async def`s, qualified by their enclosing names."""
    found: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                if isinstance(child, ast.AsyncFunctionDef) or (
                    isinstance(child, ast.ClassDef) and child.name.lstrip("_").startswith("Async")
                ):
                    found.add(name)
                visit(child, name + ".")

    visit(ast.parse(path.read_text()), "")
    return found


def test_asyncio_code_is_written_once_as_the_source_of_its_twin() -> None:
    """Every asyncio class and coroutine is in a module the generator writes a blocking
    twin from, or in the short list above: no new twin is written twice by hand."""
    sources = {source for source, _ in _unasync().FILES}
    generated = {target for _, target in _unasync().FILES}
    stray = {}
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC).as_posix()
        if where in sources or where in generated or where.startswith("tools/"):
            continue
        allowed = _HAND_WRITTEN.get(where, set())
        names = set() if "*" in allowed else _asyncio_names(path) - allowed
        if names:
            stray[where] = sorted(names)
    assert stray == {}


def _unasync() -> Any:
    spec = importlib.util.spec_from_file_location(
        "unasync", SRC.parents[1] / "scripts" / "unasync.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Private attributes of redis-py and asyncio objects (a connection's socket, parser,
# reader or buffer, a stream's writer or transport, a pool's connection lists, a retry
# policy's parts, an event loop's ready queue), reached on anything but ``self``/``cls``;
# redis-py's private modules; attributes of redlease's own hung onto foreign objects.
_FOREIGN_PRIVATE = re.compile(
    r"(?<!\bself)(?<!\bcls)\._(?:sock|reader|buffer|parser|writer|stream|transport|ready"
    r"|in_use_connections|available_connections|connections|retries|backoff"
    r"|supported_errors|loop|protocol)\b"
    r"|\b(?:redis|valkey)\._parsers\b"
    r"|\._redlease_\w+"
    r"|\b(?:getattr|setattr|hasattr|delattr)\([^)]*,\s*[\"']_(?!_)"
)


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """The file's lines without comments and docstrings (which may name what they avoid)."""
    source = path.read_text()
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and node.end_lineno is not None
        ):
            for row in range(node.lineno, node.end_lineno + 1):
                lines[row - 1] = ""
    return list(enumerate(lines, start=1))


# Parsed when the module is collected: CPython 3.11's ast.parse is not safe while
# another thread parses (gh-106905), and other tests leave threads behind.
_CODE = {path: _code_lines(path) for path in sorted(SRC.rglob("*.py"))}


def _module_of(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The redlease modules ``path`` imports, at its top or inside a function (not for
    type checking only)."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("redlease")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("redlease"):
                continue
            for alias in node.names:  # `from . import _rules.flows`: the module, if it is one
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in _MODULES else target)
    return found - {module}


_MODULES = {_module_of(path) for path in SRC.rglob("*.py")}


def test_the_import_graph_has_no_cycle() -> None:
    """No module imports one that imports it back, however far round, not even inside a
    function: each layer stands on the ones below it (the tools aside, which no library
    module imports)."""
    graph = {
        _module_of(path): _imports(path)
        for path in SRC.rglob("*.py")
        if "tools" not in path.relative_to(SRC).parts
    }
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path now, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph.get(module, set())):
            if state.get(imported) == 1:
                cycles.append([*path[path.index(imported) :], imported])
            elif imported not in state:
                visit(imported)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []


def test_no_private_attribute_of_another_library_is_touched() -> None:
    offending = [
        f"{path.relative_to(SRC)}:{row}: {line.strip()}"
        for path, lines in _CODE.items()
        for row, line in lines
        if _FOREIGN_PRIVATE.search(line)
    ]
    assert offending == []


_CLI = SRC / "_cli"


def test_the_library_never_imports_its_tools() -> None:
    """The demo, the fault harness, the broken locks and the server launcher live in
    redlease.tools, apart from the core: no core module imports them."""
    tools = SRC / "tools"
    for path in sorted(SRC.rglob("*.py")):
        if tools in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                names = [alias.name for alias in node.names]
                assert "tools" not in module.split(".") or _CLI in path.parents, (path, module)
                assert node.level == 0 or "tools" not in names or _CLI in path.parents, path
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert ".tools" not in alias.name, (path, alias.name)


def _own_names(tree: ast.Module) -> set[str]:
    """The names a module defines: its functions, classes and globals, the attributes its
    classes declare, and those its methods set on ``self``/``cls``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # (__slots__, setdefault's attribute names)
    return names


# Underscored names the standard library documents as public (os._exit: ending a process
# at once, without its shutdown, as the command does on a signal once it is ending).
_DOCUMENTED = frozenset({"os._exit"})


def _reaches_in(path: Path) -> list[str]:
    """Where a module reads or sets an underscored name another module owns: through an
    object that is not its own ``self``/``cls``, or by importing it."""
    tree = ast.parse(path.read_text())
    own, found = _own_names(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name, via = node.attr, node.value
            if name.startswith("__") or not name.startswith("_") or name in own:
                continue
            if isinstance(via, ast.Name) and via.id in ("self", "cls"):
                continue  # a subclass using what its base gives it
            if ast.unparse(node) in _DOCUMENTED:
                continue
            found.append(f"{path.relative_to(SRC)}:{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.level:
            package = path.parents[node.level - 1].joinpath(*(node.module or "").split("."))
            for alias in node.names:
                name = alias.name
                module = (package / name).is_dir() or (package / f"{name}.py").is_file()
                if name.startswith("_") and not name.startswith("__") and not module:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} import {name}")
    return found


def test_modules_talk_through_each_others_public_names() -> None:
    """Underscores mean "this module only": what another module needs of one (a lease's
    renewal, a lock's spec) it reaches through public names, so that a module's private
    names can change without a look at any other."""
    library = [p for p in sorted(SRC.rglob("*.py")) if "tools" not in p.relative_to(SRC).parts]
    reaching = [where for path in library for where in _reaches_in(path)]
    assert reaching == []


def test_a_public_class_is_itself_a_flavour_base_and_an_asyncio_marker_at_most() -> None:
    """One class per primitive and flavour: the public class, at most one flavour base
    (the front it is), and asyncio's marker; the rules are an object it holds."""
    import inspect

    import redlease

    deep = {}
    for name in redlease.__all__:
        cls = getattr(redlease, name)
        if not inspect.isclass(cls) or issubclass(cls, BaseException):
            continue
        own = [c.__qualname__ for c in cls.__mro__ if c.__module__.startswith("redlease")]
        if len(own) > 3:
            deep[name] = own
    assert deep == {}


def test_the_blocking_api_says_nothing_of_asyncio() -> None:
    """``help(redlease.Lock)`` and the blocking twins' other docs speak of threads only:
    what the asyncio sources say of asyncio alone is left out of the generated twins.
    (``once``, which serves both flavours, is the one blocking name that may.)"""
    import inspect
    import pydoc

    import redlease

    words = re.compile(r"asyncio|cancel_on_lost|async with|\bawait\b|\btasks?\b|event loop")
    said = {}
    for name in redlease.__all__:
        obj = getattr(redlease, name)
        if name.startswith(("Async", "a")) or name == "once":
            continue
        if inspect.isclass(obj) or inspect.isfunction(obj):
            text = pydoc.render_doc(obj, renderer=pydoc.plaintext)  # type: ignore[attr-defined]
            hits = [line.strip() for line in text.splitlines() if words.search(line)]
            if hits:
                said[name] = hits
    assert said == {}
