"""The blocking renewer (the watchdog's I/O; its rules are ``_rules.renewal``'s): two daemon
threads per process. Written by hand: the asyncio renewer (``_async.renewer``) differs by
design, as a task cannot be held up the way a thread can."""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from .._base import fork as _fork
from .._base import threads as _threads
from .._base.timing import MONOTONIC
from .._base.types import Clock
from .._rules.lease import LeaseState
from .._rules.renewal import Batch, Renewal, Schedule, failed, tell

log = logging.getLogger(__name__)


class Renewer:
    """Renews the auto-renewed leases of sync locks with two daemon threads for the whole
    process, started by the first registration and gone when nothing is watched: the
    renewer keeps time, tells holders and hands due batches to its sender, which does
    the I/O. A server that hangs (even in a connection handshake) can hold up the
    sender, never the renewer: holders are still told by their deadline."""

    def __init__(self, clock: Clock = MONOTONIC) -> None:
        self._clock = clock
        self._schedule = Schedule()
        # Entered as the lock itself, never as the Condition, whose enter and exit are
        # Python code: an error raised there by a signal handler (a Ctrl-C the application
        # catches) could leave the lock taken for good (see _base.fork.thread_lock).
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._sender: threading.Thread | None = None
        self._job: list[Batch] | None = None  # batches handed to the sender
        self._wake_at = math.inf

    def register(self, lease: LeaseState, io: Any, max_hold: float | None) -> None:
        with self._lock:
            renewal = self._schedule.add(lease, io, self._clock(), max_hold)
            lease.watched(lambda: self._forget(renewal))
            if self._thread is None:
                thread = self._thread = _threads.made(self._run, name="redlease-renewer")
                try:
                    _threads.start(thread)
                except BaseException:
                    if thread.ident is None:  # (started or not: see _threads.start)
                        self._thread = None
                    raise
            elif renewal.next_event() < self._wake_at:
                self._cond.notify_all()

    def _forget(self, renewal: Renewal) -> None:
        with self._lock:
            self._schedule.discard(renewal)
            if not self._schedule:
                self._cond.notify_all()  # nothing left: let the threads end now

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except BaseException:
            log.exception("lease renewer stopped")
            with self._lock:
                self._thread = None
            raise

    def _step(self) -> bool:
        with self._lock:
            now = self._clock()
            losses = self._schedule.expire(now)
            if not self._schedule:
                self._thread = None
                self._cond.notify_all()
            elif self._job is None:
                self._job = self._schedule.take_due(now) or None
                if self._job is not None:
                    if self._sender is None:
                        self._sender = _threads.daemon(self._send, name="redlease-renewer-io")
                    self._cond.notify_all()
            if self._thread is not None and not losses:
                # While the sender is busy only deadlines matter here.
                wake = self._schedule.next_wakeup(renewing=self._job is None)
                if wake is not None:
                    self._wake_at = wake
                    self._cond.wait(max(0.0, wake - now))
                    self._wake_at = math.inf
            running = self._thread is not None
        tell(losses)
        return running

    def _send(self) -> None:
        while True:
            with self._lock:
                while self._job is None:
                    if not self._schedule:
                        self._sender = None
                        return
                    self._cond.wait()
                batches = self._job
            try:
                for batch in batches:
                    with self._lock:
                        calls, _ = self._schedule.start(batch, self._clock())
                    if not calls:
                        continue
                    try:
                        results = batch.io.execute_many(calls)
                    except Exception as exc:
                        results = failed(exc, len(calls))
                    with self._lock:
                        losses = self._schedule.settle(batch, results, self._clock())
                    tell(losses)
            finally:
                with self._lock:
                    self._job = None
                    self._cond.notify_all()

    def _after_fork_in_child(self) -> list[Renewal]:
        # The parent's threads do not exist here and its lock may have been held at the
        # fork: start over with fresh state.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._thread = self._sender = self._job = None
        self._wake_at = math.inf
        return self._schedule.clear()


RENEWER = Renewer()


def watch(lease: LeaseState, io: Any, max_hold: float | None) -> None:
    """Keep a sync lease renewed (``max_hold=0``: only watch its validity)."""
    RENEWER.register(lease, io, max_hold)


def _after_fork_in_child() -> None:
    for renewal in RENEWER._after_fork_in_child():
        renewal.lease.forked()


_fork.in_child(_after_fork_in_child)
