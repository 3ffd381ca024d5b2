"""What the blocking flavour does differently, in one place (twin of ``_backend_async``,
whose docstring says what belongs here)."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from . import _fork
from ._endpoint import CLIENT_CALLS, ReplyTimedOut

T = TypeVar("T")

ASYNC = False  # the flavour: what a client family is asked for

sleep = time.sleep

current_holder = threading.current_thread  # what a lease is acquired by


class Cancelled(BaseException):
    """Never raised: a blocking call is not cancelled (a thread cannot be)."""


def shielded(work: Callable[[], T]) -> T:
    """``work()``: a blocking call cannot be cut in half by a cancellation."""
    return work()


class Flag:
    """Set once, from any thread; waited for with a bound."""

    def __init__(self) -> None:
        self._event = threading.Event()
        _fork.renew_in_child(self)

    def _after_fork(self) -> None:
        # The event's lock may have been held by a thread of the parent (setting it, or
        # starting a wait) at the fork; whether it was set carries over.
        was_set, self._event = self._event.is_set(), threading.Event()
        if was_set:
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout: float) -> None:
        """Return once set, or after ``timeout`` seconds."""
        self._event.wait(timeout)


def bounded(call: Callable[[], T], timeout: float, late: list[Any] | None = None) -> T:
    """``call()`` (a client's own method, with no bound of ours) given up on after
    ``timeout``: it runs on in a daemon thread of its own, its outcome unseen, as a reply
    that comes too late is on a connection of ours. ``late`` keeps such a call of the same
    client while it runs: until it returns, the client counts as not answering, so a hung
    server costs one thread, not one per round."""
    if late is None:
        late = []
    if late:
        if late[0].is_alive():
            raise ReplyTimedOut("its previous call, given up on, has not returned yet")
        late.clear()
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the caller below
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="redlease-bounded-call", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        late.append(thread)
        raise ReplyTimedOut(f"no reply within {timeout:.3f}s")
    done, value = outcome[0]
    if done:
        return value  # type: ignore[no-any-return]
    raise value


# Each client's gate: at most CLIENT_CALLS calls through it at once.
_GATES: weakref.WeakKeyDictionary[Any, threading.BoundedSemaphore] = weakref.WeakKeyDictionary()
_GATES_LOCK = threading.Lock()


def _new_gates() -> None:
    # A thread of the parent may have held a gate (or the lock) at the fork.
    global _GATES_LOCK
    _GATES_LOCK = threading.Lock()
    _GATES.clear()


_fork.in_child(_new_gates)


@contextlib.contextmanager
def gate(client: Any, timeout: float) -> Iterator[None]:
    """A call through ``client``'s own methods, once one of its CLIENT_CALLS is free;
    ReplyTimedOut if none is within ``timeout`` (its calls hang: a node down)."""
    gate = _GATES.get(client)
    if gate is None:
        with _GATES_LOCK:
            gate = _GATES.setdefault(client, threading.BoundedSemaphore(CLIENT_CALLS))
    if not gate.acquire(timeout=timeout):
        raise ReplyTimedOut(f"{CLIENT_CALLS} calls through the client under way for {timeout}s")
    try:
        yield
    finally:
        gate.release()


def meet_cluster(client: Any) -> None:
    """A blocking Cluster client learns its nodes when it is made: nothing to do."""
