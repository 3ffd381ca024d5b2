"""What a caller holds: a lease's I/O (``extend``, ``release``, ``with lease:``) over the
state in ``_rules.lease``, and the driver protocol its lock's flows run through. Written once,
as asyncio code; ``scripts/unasync.py`` generates the blocking twin.
"""

from __future__ import annotations

import asyncio  # unasync: async only
import contextlib
from collections.abc import Callable, Generator, Sequence
from types import TracebackType
from typing import Any, Protocol, TypeVar

from .._base import fork as _fork
from .._base.errors import LockError, LockLost, QuorumError
from .._base.misuse import AsyncOnly  # unasync: async only
from .._rules import flows as _flows
from .._rules.lease import (
    HELD,
    RELEASED,
    LeaseState,
    lost_at_block_end,
    release_flow,
    stop_watching,
)
from .._rules.multilock import MultiLeaseState
from .backend import Cancelled, shielded

T = TypeVar("T")
_Block = TypeVar("_Block", bound="AsyncLeaseBlock")


class AsyncDriver(Protocol):
    """Runs a lock's flows on its server(s) (``AsyncIO``, or a Redlock's nodes): what a
    lease, its lock's front and the renewer need."""

    async def run(self, flow: Generator[Any, Any, T], action: str) -> T: ...

    async def check_server_once(self, within: float | None = None) -> None: ...

    async def execute_many(self, steps: Sequence[Any]) -> list[Any]:
        """The first steps of several leases' extend flows, at once (the renewer's)."""


class AsyncLeaseBlock(LeaseState, AsyncOnly):
    """What every lease shares: ``extend`` and ``release`` (the lease's flows, run by its
    driver ``_io``) and ``with lease:``, which releases it when the block ends; asyncio's
    also the task to cancel when the lease is lost (``cancel_on_lost``)."""

    _io: AsyncDriver
    # unasync: async only
    _holder: asyncio.Task[Any] | None = None  # set by the lock when cancel_on_lost

    def _mark_lost(self, reason: str) -> bool:
        marked = super()._mark_lost(reason)
        if marked and self._holder is not None:
            _cancel_holder(self._holder, f"lease on {self.name!r} was lost: {reason}")
        return marked

    # unasync: end

    async def extend(self, ttl: float | None = None) -> None:
        """Make the lease last ``ttl`` seconds from now (default: the lock's ttl).

        Raises LockLost if it is no longer ours (a Redlock's: if a majority says so; if
        too few nodes answer to tell, QuorumError, and the lease keeps its validity).
        """
        ttl_ms = self._extend_ttl_ms(ttl)
        self.check()
        with self._lost_on_lock_lost():
            until = await self._io.run(self._extend_flow(ttl_ms), "extend")
        self._renewed(until)

    async def release(self) -> None:
        """Give the lock back (and hand it to the next waiter). Releasing twice is a no-op.

        A lease of a ``reentrant`` lock acquired n times is released on the server by
        the n-th release; the ones before only count down ``hold_count``.

        Raises LockLost if the lock had expired or been taken over before the release. A
        Redlock's: QuorumError if too few nodes answered (the lease counts as released:
        what is left expires with the ttl). asyncio: cancelling the caller does not
        cancel the release itself.
        """
        self._release_calls += 1  # (first: see _rules.lease.release_calls)
        if self._state == RELEASED:
            return
        if self._holds > 1:  # a reentrant lease's inner hold: one hold fewer, no I/O
            try:
                self.check()  # a lease lost meanwhile says so at each release
            finally:
                self._holds -= 1
            return
        try:
            self._not_forked()
            with self._releasing():
                await self._io.run(self._release_flow(), "release")
        except LockError:
            raise
        except Cancelled:
            # Cancelled mid-release: it may or may not have reached the server(s). Run
            # it again to the end, shielded, then let the cancellation go on. "Not ours"
            # now may mean the first one did land, so it is not reported.
            with contextlib.suppress(LockLost, QuorumError):
                await shielded(lambda: self._io.run(self._release_flow(), "release"))
            self._mark_released()
            raise
        except BaseException:
            # Interrupted (an error raised by a signal handler: a Ctrl-C the program
            # goes on after) before, while or after the release was sent: finished in
            # haste, then the interruption goes on.
            await self._finish_in_haste()
            raise

    async def _finish_in_haste(self) -> None:
        """The release of a lease whose holder was interrupted as it let go: its
        renewal stopped first, then its release sent again (a second run is harmless)
        within half a second and without retry (``_rules.flows.release``'s
        ``hurried``): what a server that does not answer keeps expires with the ttl. A
        reentrant lease held more than once gives up one hold. Nothing if it is released
        or lost already, or a fork's parent's. One more interruption while the release
        is on its way sends it once more; a third may cut it short."""
        if self._state != HELD or self._generation != _fork.generation:
            return
        if self._holds > 1:
            self._holds -= 1
            return
        try:
            self._mark_released()  # (renewal stops, whatever comes of the release)
            await self._send_in_haste()
        except BaseException:
            self._mark_released()
            await self._send_in_haste()
            raise

    async def _send_in_haste(self) -> None:
        with contextlib.suppress(Exception):
            await self._io.run(self._release_flow(hurried=True), "release")

    async def __aenter__(self: _Block) -> _Block:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except LockLost as lost:
            lost_at_block_end(self, lost, exc)


class AsyncLease(AsyncLeaseBlock):
    """A held lock. Use it as a context manager to release it when the block ends."""

    def __init__(
        self,
        spec: _flows.LockSpec,
        grant: _flows.Grant,
        io: AsyncDriver,
        on_lost: Callable[[Any], object] | None = None,
    ) -> None:
        super().__init__(spec, grant, on_lost)
        self._io = io


async def give_back_in_haste(lease: AsyncLease) -> None:
    """Give back a one-server lease as the process goes away: its renewal stopped, its
    release bounded to half a second with no retry (``_rules.flows.release``'s
    ``hurried``); BackendError if that fails, and what the server keeps then expires
    with the ttl."""
    stop_watching(lease)
    await lease._io.run(release_flow(lease, hurried=True), f"give back {lease.name!r}")


async def finish_in_haste(held: object) -> None:
    """A lease's release, or each of a multi-lease's, finished in haste (see
    ``AsyncLeaseBlock._finish_in_haste``); anything else holds nothing."""
    if isinstance(held, AsyncLeaseBlock):
        await held._finish_in_haste()
    elif isinstance(held, MultiLeaseState):
        leases = list(held.leases.values())
        for lease in leases:  # every renewal stops first, whatever cuts the rest short
            stop_watching(lease)
        for lease in leases:
            await finish_in_haste(lease)


# unasync: async only
def set_holder(lease: AsyncLeaseBlock, task: asyncio.Task[Any] | None) -> asyncio.Task[Any] | None:
    """The task to cancel when ``lease`` is lost (None: none); returns the one before."""
    previous, lease._holder = lease._holder, task
    return previous


def _cancel_holder(task: asyncio.Task[Any], message: str) -> None:
    """Cancel the task that holds a lost lease, from any thread. Not when that task is
    the one that found the loss: it is being told already, by the error or flag it got."""
    if task.done():
        return
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is task.get_loop():
        if asyncio.current_task() is not task:
            task.cancel(message)
        return
    with contextlib.suppress(RuntimeError):  # its loop is closed: nothing left to cancel
        task.get_loop().call_soon_threadsafe(task.cancel, message)


# unasync: end
