# Generated from _async/lease.py by scripts/unasync.py: edit that file, then run
# `python scripts/unasync.py` (the tests run it with --check).
"""What a caller holds: a lease's I/O (``extend``, ``release``, ``with lease:``) over the
state in ``_rules.lease``, and the driver protocol its lock's flows run through. Written once,
as asyncio code; ``scripts/unasync.py`` generates the blocking twin.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Sequence
from types import TracebackType
from typing import Any, Protocol, TypeVar

from .._base import fork as _fork
from .._base.errors import LockError, LockLost, QuorumError
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
_Block = TypeVar("_Block", bound="SyncLeaseBlock")


class SyncDriver(Protocol):
    """Runs a lock's flows on its server(s) (``SyncIO``, or a Redlock's nodes): what a
    lease, its lock's front and the renewer need."""

    def run(self, flow: Generator[Any, Any, T], action: str) -> T: ...

    def check_server_once(self, within: float | None = None) -> None: ...

    def execute_many(self, steps: Sequence[Any]) -> list[Any]:
        """The first steps of several leases' extend flows, at once (the renewer's)."""


class SyncLeaseBlock(LeaseState):
    """What every lease shares: ``extend`` and ``release`` (the lease's flows, run by its
    driver ``_io``) and ``with lease:``, which releases it when the block ends; asyncio's
    also the task to cancel when the lease is lost (``cancel_on_lost``)."""

    _io: SyncDriver

    def extend(self, ttl: float | None = None) -> None:
        """Make the lease last ``ttl`` seconds from now (default: the lock's ttl).

        Raises LockLost if it is no longer ours (a Redlock's: if a majority says so; if
        too few nodes answer to tell, QuorumError, and the lease keeps its validity).
        """
        ttl_ms = self._extend_ttl_ms(ttl)
        self.check()
        with self._lost_on_lock_lost():
            until = self._io.run(self._extend_flow(ttl_ms), "extend")
        self._renewed(until)

    def release(self) -> None:
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
                self._io.run(self._release_flow(), "release")
        except LockError:
            raise
        except Cancelled:
            # Cancelled mid-release: it may or may not have reached the server(s). Run
            # it again to the end, shielded, then let the cancellation go on. "Not ours"
            # now may mean the first one did land, so it is not reported.
            with contextlib.suppress(LockLost, QuorumError):
                shielded(lambda: self._io.run(self._release_flow(), "release"))
            self._mark_released()
            raise
        except BaseException:
            # Interrupted (an error raised by a signal handler: a Ctrl-C the program
            # goes on after) before, while or after the release was sent: finished in
            # haste, then the interruption goes on.
            self._finish_in_haste()
            raise

    def _finish_in_haste(self) -> None:
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
            self._send_in_haste()
        except BaseException:
            self._mark_released()
            self._send_in_haste()
            raise

    def _send_in_haste(self) -> None:
        with contextlib.suppress(Exception):
            self._io.run(self._release_flow(hurried=True), "release")

    def __enter__(self: _Block) -> _Block:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockLost as lost:
            lost_at_block_end(self, lost, exc)


class Lease(SyncLeaseBlock):
    """A held lock. Use it as a context manager to release it when the block ends."""

    def __init__(
        self,
        spec: _flows.LockSpec,
        grant: _flows.Grant,
        io: SyncDriver,
        on_lost: Callable[[Any], object] | None = None,
    ) -> None:
        super().__init__(spec, grant, on_lost)
        self._io = io


def give_back_in_haste(lease: Lease) -> None:
    """Give back a one-server lease as the process goes away: its renewal stopped, its
    release bounded to half a second with no retry (``_rules.flows.release``'s
    ``hurried``); BackendError if that fails, and what the server keeps then expires
    with the ttl."""
    stop_watching(lease)
    lease._io.run(release_flow(lease, hurried=True), f"give back {lease.name!r}")


def finish_in_haste(held: object) -> None:
    """A lease's release, or each of a multi-lease's, finished in haste (see
    ``SyncLeaseBlock._finish_in_haste``); anything else holds nothing."""
    if isinstance(held, SyncLeaseBlock):
        held._finish_in_haste()
    elif isinstance(held, MultiLeaseState):
        leases = list(held.leases.values())
        for lease in leases:  # every renewal stops first, whatever cuts the rest short
            stop_watching(lease)
        for lease in leases:
            finish_in_haste(lease)
