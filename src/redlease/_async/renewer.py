"""The asyncio renewer (the watchdog's I/O; its rules are ``_rules.renewal``'s): one task per
event loop. Written by hand: the blocking renewer (``_sync.renewer``) differs by design, as
a thread can be held up by a hung server where a task is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

from .._base import fork as _fork
from .._base.timing import MONOTONIC
from .._base.types import Clock
from .._rules.lease import LeaseState
from .._rules.renewal import Batch, Renewal, Schedule, failed, tell


class Renewer:
    """Renews the auto-renewed leases of asyncio locks on one event loop: one task,
    started by the first registration, gone when nothing is watched. Batches for
    different servers are in flight at the same time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Clock = MONOTONIC) -> None:
        self._loop = loop
        self._clock = clock
        self._schedule = Schedule()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._wake_at = math.inf

    def register(self, lease: LeaseState, io: Any, max_hold: float | None) -> None:
        renewal = self._schedule.add(lease, io, self._clock(), max_hold)
        lease.watched(lambda: self._forget(renewal))
        if self._task is None:
            self._task = self._loop.create_task(self._run(), name="redlease-renewer")
        elif renewal.next_event() < self._wake_at:
            self._wakeup.set()

    def _forget(self, renewal: Renewal) -> None:
        try:
            here = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            here = False
        if here:
            self._discard(renewal)
        else:  # a lease found lost from another thread: the schedule is the loop's
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop.call_soon_threadsafe(self._discard, renewal)

    def _discard(self, renewal: Renewal) -> None:
        self._schedule.discard(renewal)
        if not self._schedule:
            self._wakeup.set()  # nothing left: let the task end now

    async def _run(self) -> None:
        try:
            while True:
                now = self._clock()
                losses = self._schedule.expire(now)
                batches = self._schedule.take_due(now)
                tell(losses)
                if batches:
                    await asyncio.gather(*(self._send(batch) for batch in batches))
                    continue
                if losses:
                    continue
                wake = self._schedule.next_wakeup()
                if wake is None:
                    return
                self._wake_at = wake
                self._wakeup.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), max(0.0, wake - now))
                self._wake_at = math.inf
        finally:
            self._task = None
            if _RENEWERS.get(self._loop) is self:
                del _RENEWERS[self._loop]

    async def _send(self, batch: Batch) -> None:
        calls, wait = self._schedule.start(batch, self._clock())
        try:
            # The outer bound also covers making a new connection.
            results = await asyncio.wait_for(batch.io.execute_many(calls), wait)
        except Exception as exc:
            results = failed(exc, len(calls))
        tell(self._schedule.settle(batch, results, self._clock()))

    def _after_fork_in_child(self) -> list[Renewal]:
        self._task = None
        return self._schedule.clear()


_RENEWERS: dict[asyncio.AbstractEventLoop, Renewer] = {}


def watch(lease: LeaseState, io: Any, max_hold: float | None) -> None:
    """Keep an asyncio lease renewed by the running loop's renewer."""
    loop = asyncio.get_running_loop()
    renewer = _RENEWERS.get(loop)
    if renewer is None:
        renewer = _RENEWERS[loop] = Renewer(loop)
    renewer.register(lease, io, max_hold)


def _after_fork_in_child() -> None:
    renewals = []
    for renewer in list(_RENEWERS.values()):
        renewals += renewer._after_fork_in_child()
    _RENEWERS.clear()
    for renewal in renewals:
        renewal.lease.forked()


_fork.in_child(_after_fork_in_child)
