"""The public facade stays tidy: everything exported exists, and nothing public is missed."""

from __future__ import annotations

import types

import redlease


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
