"""``os.fork()``: the one place that tells whether this process is a fork of the one that
made an object. A child holds none of its parent's leases and never uses its sockets.

Objects that care note ``generation`` when made and compare it on use: an int compare,
where ``os.getpid()`` is a system call on every use. ``after_fork_in_child`` runs the
callbacks registered with ``in_child`` (the lease and renewer bookkeeping).
"""

from __future__ import annotations

import os
from collections.abc import Callable

generation = 0  # how many forks lie between the first process and this one

_CALLBACKS: list[Callable[[], None]] = []


def in_child(callback: Callable[[], None]) -> None:
    """Run ``callback`` in every child right after a fork (after ``generation`` moved)."""
    _CALLBACKS.append(callback)


def _after_fork_in_child() -> None:
    global generation
    generation += 1
    for callback in _CALLBACKS:
        callback()


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
