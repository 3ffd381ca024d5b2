"""The public facade stays tidy: everything exported exists, and nothing public is missed."""

from __future__ import annotations

import inspect
import re
import types

import redlease
from redlease import metrics, sql


def test_all_is_sorted_and_complete() -> None:
    assert redlease.__all__ == sorted(redlease.__all__)
    public = {
        n
        for n in dir(redlease)
        if not n.startswith("_") and not isinstance(getattr(redlease, n), types.ModuleType)
    }
    assert public <= set(redlease.__all__)
    for name in redlease.__all__:
        assert hasattr(redlease, name), name


def test_error_tree_has_one_root() -> None:
    for error in (
        redlease.AcquireTimeout,
        redlease.LockLost,
        redlease.QuorumError,
        redlease.BackendError,
        redlease.InvalidArgument,
    ):
        assert issubclass(error, redlease.LockError)
    assert issubclass(redlease.AcquireTimeout, TimeoutError)
    assert issubclass(redlease.InvalidArgument, ValueError)
    assert issubclass(redlease.InvalidArgument, TypeError)


def test_the_lazy_names_and_the_type_checkers_names_are_the_same() -> None:
    """``redlease/__init__.py`` shows the type checkers the imports that ``_public.py``
    makes on first use: the two lists are one list, written twice."""
    import ast
    from pathlib import Path

    home = Path(redlease.__file__).parent

    def imports(tree: ast.AST) -> list[str]:
        return sorted(
            f"{node.module}:{alias.name}:{alias.asname}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1
            for alias in node.names
        )

    init = ast.parse((home / "__init__.py").read_text())
    (checking,) = [
        node
        for node in init.body
        if isinstance(node, ast.If)
        and "TYPE_CHECKING" in ast.unparse(node.test)
        and "not" not in ast.unparse(node.test)
    ]
    public = imports(ast.parse((home / "_public.py").read_text()))
    assert imports(ast.Module(body=checking.body, type_ignores=[])) == public
    assert {name.split(":")[1] for name in public} - {"metrics"} == set(redlease.__all__)


_PRIVATE = re.compile(r"\b(?:redlease\.)?_(?:rules|async|sync|base|wire|clients|cli|once|public)\b")


def _public_docstrings() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in redlease.__all__:
        obj = getattr(redlease, name)
        if inspect.ismodule(obj) or not (inspect.isclass(obj) or callable(obj)):
            continue
        found[name] = inspect.getdoc(obj) or ""
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                doc = getattr(member, "__doc__", None)
                if isinstance(member, property):
                    doc = member.__doc__
                if isinstance(doc, str):
                    found[f"{name}.{attr}"] = doc
    for module in (sql, metrics):
        for name in module.__all__:
            found[f"{module.__name__}.{name}"] = inspect.getdoc(getattr(module, name)) or ""
    return found


def test_the_public_docstrings_name_no_private_module() -> None:
    """The reference is made from these: a reader cannot follow ``_rules.lease``."""
    docs = _public_docstrings()
    assert len(docs) > 100
    assert {name: _PRIVATE.findall(doc) for name, doc in docs.items() if _PRIVATE.search(doc)} == {}
