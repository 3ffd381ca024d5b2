"""Batches (``batch=n`` on a fair ``Lock``/``AsyncLock``): one grant lent out n times.

Under contention a fair lock pays a wake-up of another process per hand-over. A batch
cuts them: a grant takes n fences at once (the scripts' INCRBY), and the lock object
keeps it on the server between its callers' holds, lending it again without a round
trip, for up to n holds within ``batch_window`` seconds of the grant. A hold's release
then only parks the grant here; the last hold's release, or one after the window, is a
real release that hands the lock to the next waiter in arrival order. A grant left parked
when the window ends (nobody came back for it) is released then by a timer: the
process's one closer thread, or the event loop's ``call_later``.

What holds for one lease holds for the batch as a whole: on the server the lock is held
by one token from the grant to the batch's last release, and nobody else can take it in
between. Each hold gets its own lease and a fence greater than the one before it, and
the next holder's fence is greater than all of them. What a batch costs: a waiter may
wait up to one window longer; a process that dies with a parked grant leaves it to
expire with its ttl, like any holder that dies; and a grant lost on the server (a
failover, eviction) is found out by the release that ends the batch, not by the parking
ones, which do not ask the server.

``Lender`` holds the rules and no I/O; its owner supplies the timer and the release.
"""

from __future__ import annotations

import asyncio
import atexit
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import _fork
from ._flows import Grant, LockSpec

log = logging.getLogger(__name__)

# A lent hold gets at least this share of the ttl as validity; a parked grant with less
# left is released rather than lent again.
MIN_LENT_VALIDITY = 1 / 2

Schedule = Callable[[float, Callable[[], None]], None]  # (delay s, callback)


@dataclass(slots=True)
class _Grant:
    token: str
    next_fence: int  # the next hold's fence
    last_fence: int  # the last fence the grant took
    closes_at: float  # end of the window, on the lock's clock
    valid_until: float
    generation: int  # _fork's: a fork's copy is the parent's grant
    lent: bool = True  # a hold is out (else the grant is parked)
    timed: bool = False  # the closing timer is armed


class Lender:
    """The grant one lock object lends (at most one at a time), shared by its threads or
    tasks. ``schedule(delay, callback)`` arms a timer; ``release(token)`` gives a grant
    back to the server for real (called by the timer)."""

    def __init__(self, spec: LockSpec, schedule: Schedule, release: Callable[[str], None]) -> None:
        self._spec = spec
        self._schedule = schedule
        self._release = release
        self._mutex = threading.Lock()
        self._grant: _Grant | None = None
        self._released_at: float | None = None  # this object's last real release
        self._asking = 0  # this object's real acquisitions under way (queued, maybe)

    def holds(self) -> int:
        """Fences the next real acquisition asks for: the batch's when this object was
        taken again within a window of its last real release (its callers come straight
        back for it), else 1: a grant parked for callers that do not come back would
        only keep the next waiter waiting."""
        at = self._released_at
        if at is not None and self._spec.clock() - at <= self._spec.batch_window:
            return self._spec.batch
        return 1

    def asking(self, step: int) -> None:
        """A real acquisition of this object starts (+1) or ends (-1). While one is under
        way, a hold's release does not park: that caller is queued on the server, and
        the grant reaches it (or whoever is ahead of it) sooner through a real release
        than at the window's end."""
        with self._mutex:
            self._asking += step

    def lend(self) -> tuple[Grant | None, str | None]:
        """A hold lent from the parked grant, if it has one to give; else (None, the token
        of a parked grant that can no longer be lent and must be released first)."""
        clock = self._spec.clock
        with self._mutex:
            g = self._grant
            if g is None or g.lent:
                return None, None
            if g.generation != _fork.generation:  # a fork's copy: the grant is the parent's
                self._grant = None
                return None, None
            now = clock()
            if (
                now < g.closes_at
                and g.next_fence <= g.last_fence
                and g.valid_until - now >= self._spec.ttl * MIN_LENT_VALIDITY
            ):
                g.lent = True
                g.next_fence += 1
                return Grant(g.token, g.next_fence - 1, g.valid_until), None
            self._grant, self._released_at = None, now
            return None, g.token

    def granted(self, grant: Grant, holds: int) -> None:
        """A real acquisition succeeded, with ``holds`` fences (as many as it asked for, or
        fewer): its grant is lent to that caller first, and kept for the next ones if it
        has fences left."""
        with self._mutex:
            if holds <= 1:
                self._grant = None
                return
            self._grant = _Grant(
                grant.token,
                grant.fence + 1,
                grant.fence + holds - 1,
                self._spec.clock() + self._spec.batch_window,
                grant.valid_until,
                _fork.generation,
            )

    def park(self, token: str, fence: int, valid_until: float) -> bool:
        """A hold (``token``, ``fence``) is being released: True if its grant is kept for
        the next hold (nothing to send), False if the caller must release it for real."""
        clock = self._spec.clock
        with self._mutex:
            now = clock()
            g = self._grant
            if g is None or not g.lent or g.token != token or g.next_fence != fence + 1:
                self._released_at = now
                return False  # not the hold this grant lent last
            if (
                now >= g.closes_at
                or g.next_fence > g.last_fence
                or now >= valid_until
                or self._asking
            ):
                self._grant, self._released_at = None, now
                return False
            g.lent, g.valid_until = False, valid_until
            if g.timed:
                return True
            g.timed = True
            delay = g.closes_at - now
        self._schedule(delay, self._close)
        return True

    def take_parked(self) -> str | None:
        """The token of a parked grant, taken out to be given back now (an event loop
        that stops); None if there is none."""
        with self._mutex:
            g = self._grant
            if g is None or g.lent or g.generation != _fork.generation:
                return None
            self._grant, self._released_at = None, self._spec.clock()
            return g.token

    def _close(self) -> None:
        """The window has ended: a grant still parked goes back to the server."""
        with self._mutex:
            g = self._grant
            if g is None:
                return
            if g.lent:  # its hold's release decides (a timer run early would re-arm)
                g.timed = False
                return
            self._grant, self._released_at = None, self._spec.clock()
            if g.generation != _fork.generation:
                return
        self._release(g.token)


class _Closer:
    """The process's one timer thread for sync batches (started on first use; a fork's
    child starts its own, without its parent's timers). At exit, timers still pending
    run at once, so grants left parked are given back."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._generation = -1

    def schedule(self, delay: float, callback: Callable[[], None]) -> None:
        when = time.monotonic() + delay
        with self._cond:
            if self._generation != _fork.generation:  # first use, or first in a fork's child
                self._generation, self._timers = _fork.generation, []
                thread = threading.Thread(target=self._run, name="redlease-batches", daemon=True)
                thread.start()
            heapq.heappush(self._timers, (when, next(self._order), callback))
            if self._timers[0][2] is callback:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._timers or self._timers[0][0] > time.monotonic():
                    self._cond.wait(self._timers[0][0] - time.monotonic() if self._timers else None)
                callback = heapq.heappop(self._timers)[2]
            _run_timer(callback)

    def flush(self) -> None:
        with self._cond:
            if self._generation != _fork.generation:
                return
            due, self._timers = self._timers, []
        for _, _, callback in sorted(due):
            _run_timer(callback)


def _run_timer(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        log.exception("giving back a batch's parked grant failed; it expires with its ttl")


def in_loop(delay: float, callback: Callable[[], None]) -> None:
    """An asyncio lock's batch timer: the running loop's (a grant still parked when the
    loop stops expires with its ttl)."""
    asyncio.get_running_loop().call_later(delay, callback)


CLOSER = _Closer()
atexit.register(CLOSER.flush)
