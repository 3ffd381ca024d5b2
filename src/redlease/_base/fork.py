"""``os.fork()``: the one place that tells whether this process is a fork of the one that
made an object. A child holds none of its parent's leases and never uses its sockets.

Objects that care note ``generation`` when made and compare it on use: an int compare,
where ``os.getpid()`` is a system call on every use. Right after a fork, in the child,
the methods registered with ``renew_in_child`` and the callbacks registered with
``in_child`` (the lease and renewer bookkeeping) run.

Locks: a fork copies every lock as it is, and one that another thread of the parent held
at that moment stays held in the child for good (that thread does not exist there). So a
lock that outlives one call is never taken in a child before it is made anew or freed: a
module-level one through ``in_child``, an object's through ``renew_in_child`` (the method
the object gives, while it lives); both run in the child right after the fork, where the
forking thread is the only one and nothing can be inside a critical section
(``thread_lock``'s are freed there).
Checking ``generation`` after taking such a lock is too late.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable

log = logging.getLogger(__name__)

generation = 0  # how many forks lie between the first process and this one

_CALLBACKS: list[Callable[[], None]] = []


# Weak: an object whose method is registered here lives no longer for it, and its entry
# goes with it.
_METHODS: set[weakref.WeakMethod[Callable[[], None]]] = set()


def in_child(callback: Callable[[], None]) -> None:
    """Run ``callback`` in every child right after a fork (after ``generation`` moved)."""
    _CALLBACKS.append(callback)


def renew_in_child(method: Callable[[], None]) -> None:
    """Call the bound ``method`` (which makes its object's locks anew) in every child
    right after a fork, while its object lives."""
    _METHODS.add(weakref.WeakMethod(method, _METHODS.discard))


def _after_fork_in_child() -> None:
    global generation
    generation += 1
    # The locks first: the callbacks may take some.
    for lock in list(_LOCKS):
        if lock.locked():
            lock.release()
    for fresh in [ref() for ref in list(_METHODS)] + _CALLBACKS:
        if fresh is None:  # (its object went meanwhile)
            continue
        try:
            fresh()
        except Exception:  # one that fails must not leave the others' locks held
            log.exception("making a lock anew in a forked child failed")


# Locks made by thread_lock, freed in a child (weak: a lock lives no longer for it)
_LOCKS: weakref.WeakSet[threading.Lock] = weakref.WeakSet()


def thread_lock() -> threading.Lock:
    """A thread lock that a forked child finds free, for state shared by threads of either
    flavour that the rules keep (they import no thread module themselves).

    A plain ``threading.Lock``, used in ``with`` as it is: its enter and exit are the
    lock's own, with no Python code between taking it and the ``with`` block owning it,
    where an exception raised by a signal handler (a Ctrl-C the application catches)
    would leave it taken for good. It stays the same object in a child, where
    ``_after_fork_in_child`` frees it if the fork caught it taken (a primitive lock may be
    released by any thread)."""
    lock = threading.Lock()
    _LOCKS.add(lock)
    return lock


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
