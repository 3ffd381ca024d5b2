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
