"""What a caller holds: a lease's I/O (``extend``, ``release``, ``with lease:``) over the
state in ``_rules.lease``, and the driver protocol its lock's flows run through. Written once,
as asyncio code; ``scripts/unasync.py`` generates the blocking twin.
"""

from __future__ import annotations

import asyncio  # unasync: async only
import contextlib
from collections.abc import Generator, Sequence
from types import TracebackType
from typing import Any, Protocol, TypeVar

from .._base import fork as _fork
from .._base.errors import LockError, LockLost, QuorumError
from .._base.misuse import AsyncOnly  # unasync: async only
from .._rules.lease import HELD, RELEASED, LeaseState, lost_at_block_end
from .._rules.multilock import MultiLeaseState
from .backend import Cancelled, Flag, shielded

T = TypeVar("T")

# Guards the note of a release on its way (``AsyncLease._sending``): leases are handed
# between threads, and released there.
_SENDING = _fork.thread_lock()
# How long a second release of a lease waits for the first one's end, in reply bounds (the
# first one is given up on by then).
_SECOND_RELEASE_WAIT = 2.0
_Lease = TypeVar("_Lease", bound="AsyncLease")


class AsyncDriver(Protocol):
    """Runs a lock's flows on its server(s) (``AsyncIO``, or a Redlock's nodes): what a
    lease, its lock's front and the renewer need."""

    async def run(self, flow: Generator[Any, Any, T], action: str) -> T: ...

    async def check_server_once(self, within: float | None = None) -> None: ...

    async def execute_many(self, steps: Sequence[Any]) -> list[Any]:
        """The first steps of several leases' extend flows, at once (the renewer's)."""


class AsyncLease(AsyncOnly):
    """A held lock. Use it as a context manager to release it when the block ends.

    Its rules (validity, holds, the lost flag, ``on_lost``) are the ``LeaseState`` it
    holds (``_rules.lease``); it adds ``extend``, ``release`` and ``with``, run by its
    driver."""

    # unasync: async only
    _holder: asyncio.Task[Any] | None = None  # cancelled when it is lost (cancel_on_lost)

    # unasync: end
    # A release of it on its way, and what a second caller's release waits on meanwhile.
    _sending = False
    _sent: Flag | None = None

    def __init__(self, state: LeaseState, io: AsyncDriver) -> None:
        self._state, self._io = state, io
        state.lease = self

    @property
    def name(self) -> str:
        """The name of the lock this lease is for."""
        return self._state.spec.name

    @property
    def token(self) -> str:
        """The random value that proves ownership on the server."""
        return self._state.token

    @property
    def fence(self) -> int:
        """Fencing token: strictly greater than any earlier grant's for this name."""
        return self._state.fence

    @property
    def valid_until(self) -> float:
        """End of validity on the lock's monotonic clock."""
        return self._state.valid_until

    def remaining(self) -> float:
        """Seconds of validity left (0.0 once expired, released or lost), by this
        process's clock, drift margin taken off. Never raises."""
        return self._state.remaining()

    @property
    def lost(self) -> bool:
        """True once the lease is known gone or its validity has run out (not after release)."""
        return self._state.lost()

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost, in words: the server said it is no longer ours
        (expired, or taken over: ``redlease release --force``, a failover), its renewals
        failed until its validity ran out, renewal stopped at ``max_hold``... None while
        it is not lost."""
        state = self._state
        return state.reason if state.lost() else None

    @property
    def released(self) -> bool:
        """True once released (``release()``, or the end of its ``with`` block)."""
        return self._state.status == RELEASED

    @property
    def hold_count(self) -> int:
        """How many acquisitions this lease stands for and that are not released yet: 1,
        or more when a ``reentrant`` lock was acquired again by the thread (asyncio: the
        task) that holds it. Only the release of the last one releases on the server."""
        return self._state.hold_count()

    def check(self) -> None:
        """Raise LockLost unless the lease is still held and valid: call it before each
        step of protected work (and pass ``fence`` to the resource when it can check it)."""
        self._state.check()

    async def extend(self, ttl: float | None = None) -> None:
        """Make the lease last ``ttl`` seconds from now (default: the lock's ttl).

        Raises LockLost if it is no longer ours (a Redlock's: if a majority says so; if
        too few nodes answer to tell, QuorumError, and the lease keeps its validity).
        """
        state = self._state
        ttl_ms = state.extend_ttl_ms(ttl)
        state.check()
        with state.lost_on_lock_lost():
            until = await self._io.run(state.extend_flow(ttl_ms), "extend")
        state.renewed(until)

    async def release(self) -> None:
        """Give the lock back (and hand it to the next waiter). Releasing twice is a no-op.

        A lease of a ``reentrant`` lock acquired n times is released on the server by
        the n-th release; the ones before only count down ``hold_count``.

        Raises LockLost if the lock had expired or been taken over before the release. A
        Redlock's: QuorumError if too few nodes answered (the lease counts as released:
        what is left expires with the ttl). asyncio: cancelling the caller does not
        cancel the release itself.
        """
        state = self._state
        state.release_calls += 1  # (first: see _rules.lease.release_calls)
        if state.status == RELEASED:
            return
        if state.holds > 1:  # a reentrant lease's inner hold: one hold fewer, no I/O
            try:
                state.check()  # a lease lost meanwhile says so at each release
            finally:
                state.holds -= 1
            return
        if self._sending:  # another caller's release of it is on its way
            await self._second_release(state)
            return
        try:
            self._sending = True
            state.not_forked()
            with state.releasing():
                await self._io.run(state.release_flow(), "release")
        except LockError:
            raise
        # unasync: async only
        except Cancelled:
            # Cancelled mid-release: it may or may not have reached the server(s). Run
            # it again to the end, shielded, then let the cancellation go on. "Not ours"
            # now may mean the first one did land, so it is not reported.
            with contextlib.suppress(LockLost, QuorumError):
                await shielded(lambda: self._io.run(state.release_flow(), "release"))
            state.mark_released()
            raise
        # unasync: end
        except BaseException:
            # Interrupted (an error raised by a signal handler: a Ctrl-C the program
            # goes on after) before, while or after the release was sent: finished in
            # haste, then the interruption goes on.
            await self._finish_in_haste()
            raise
        finally:
            with _SENDING:
                self._sending, sent, self._sent = False, self._sent, None
            if sent is not None:
                sent.set()

    async def _second_release(self, state: LeaseState) -> None:
        """A release of a lease whose release another caller (a thread, a task it was
        handed to) has on its way: the no-op a second release is, once the first has
        ended. Not sent again: the server keeps one release mark per lock, and a
        second script run after the next holder's release would find the name gone."""
        with _SENDING:
            if not self._sending:
                return
            sent = self._sent
            if sent is None:
                sent = self._sent = Flag()
        await sent.wait(state.spec.reply_timeout * _SECOND_RELEASE_WAIT)

    async def _finish_in_haste(self) -> None:
        """The release of a lease whose holder was interrupted as it let go: its
        renewal stopped first, then its release sent again (a second run is harmless)
        within half a second and without retry (``_rules.flows.release``'s
        ``hurried``): what a server that does not answer keeps expires with the ttl. A
        reentrant lease held more than once gives up one hold. Nothing if it is released
        or lost already, or a fork's parent's. One more interruption while the release
        is on its way sends it once more; a third may cut it short."""
        state = self._state
        if state.status != HELD or state.generation != _fork.generation:
            return
        if state.holds > 1:
            state.holds -= 1
            return
        try:
            state.mark_released()  # (renewal stops, whatever comes of the release)
            await self._send_in_haste()
        except BaseException:
            state.mark_released()
            await self._send_in_haste()
            raise

    async def _send_in_haste(self) -> None:
        with contextlib.suppress(Exception):
            await self._io.run(self._state.release_flow(hurried=True), "release")

    async def __aenter__(self: _Lease) -> _Lease:
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
            lost_at_block_end(self._state, lost, exc)

    def __repr__(self) -> str:
        return self._state.described(type(self).__name__)


async def give_back_in_haste(lease: AsyncLease) -> None:
    """Give back a one-server lease as the process goes away: its renewal stopped, its
    release bounded to half a second with no retry (``_rules.flows.release``'s
    ``hurried``); BackendError if that fails, and what the server keeps then expires
    with the ttl."""
    state = lease._state
    state.stop_watching()
    await lease._io.run(state.release_flow(hurried=True), f"give back {lease.name!r}")


async def finish_in_haste(held: object) -> None:
    """A lease's release, or each of a multi-lease's, finished in haste (see
    ``AsyncLease._finish_in_haste``); anything else holds nothing. ``held``: a lease,
    its state, or a multi-lease."""
    if isinstance(held, LeaseState):
        held = held.lease
    if isinstance(held, AsyncLease):
        await held._finish_in_haste()
    elif isinstance(held, MultiLeaseState):
        leases = list(held.leases.values())
        for lease in leases:  # every renewal stops first, whatever cuts the rest short
            lease._state.stop_watching()
        for lease in leases:
            await finish_in_haste(lease)


def unhanded(lease: AsyncLease) -> None:
    """A lease that never reached its caller: released here (see ``mark_released``)."""
    lease._state.mark_released()


# unasync: async only
def set_holder(lease: AsyncLease, task: asyncio.Task[Any] | None) -> asyncio.Task[Any] | None:
    """The task to cancel when ``lease`` is lost (None: none); returns the one before."""
    previous, lease._holder = lease._holder, task
    if task is None:
        lease._state.also_told = None
    else:
        name = lease.name
        lease._state.also_told = lambda reason: _cancel_holder(
            task, f"lease on {name!r} was lost: {reason}"
        )
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
