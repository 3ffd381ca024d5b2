# Generated from _async/front.py by scripts/unasync.py: edit that file, then run
# `python scripts/unasync.py` (the tests run it with --check).
"""The front of a lock: what its caller uses — ``acquire``, ``try_acquire``, ``with`` and
the decorator — once for every kind (``Lock``, ``Semaphore``, a read/write lock's sides,
``Redlock``). A lock class supplies its driver (``_io``), the attempt it makes
(``_new_attempt``) and the lease it hands out (``_new_lease``); the front does the rest:
checking the server once, cleaning up after an interrupted attempt, starting renewal.
What needs no I/O (the `with` stack, reentrant holds, metrics) is in ``_rules.fronts``.

Written once, as asyncio code; ``scripts/unasync.py`` generates the blocking twin.
asyncio only: ``cancel_on_lost``, and ``using`` (a coroutine run
under a lease that cancels it if the lease is lost, after node-redlock's
``using(resources, duration, routine(signal))``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import Generic, TypeVar

from .._base import metrics as _metrics
from .._base.errors import AcquireTimeout
from .._rules import arguments as args
from .._rules.flows import Grant
from .._rules.fronts import (
    Attempt,
    FrontBase,
    P,
    R,
    decorate,
    pop_entered,
    push_entered,
    refuse_nested,
)
from .._rules.lease import (
    unhanded,
)
from . import renewer as _renewer_sync
from .backend import Cancelled, current_holder, shielded
from .lease import (
    SyncDriver,
    SyncLeaseBlock,
)

Seconds = float | timedelta
LeaseT = TypeVar("LeaseT", bound=SyncLeaseBlock)


class SyncFront(FrontBase, Generic[LeaseT]):
    """``acquire``, ``try_acquire``, ``with`` and ``@lock``, once for every kind of lock."""

    _io: SyncDriver

    def _new_lease(self, grant: Grant) -> LeaseT:
        raise NotImplementedError

    def acquire(self, timeout: Seconds | None = None) -> LeaseT:
        """Wait until the lock is ours and return the lease.

        ``timeout`` bounds the wait in seconds (None: no bound; 0: a single try).
        Raises AcquireTimeout if the lock stayed busy (a Redlock: QuorumError if too few
        nodes answered); BackendError if the server failed until the timeout;
        InvalidArgument for a bad ``timeout``; LockLost if a ``reentrant`` holder's lease
        was lost meanwhile. asyncio: cancelling the caller at any point leaves no lock
        behind (a lock granted meanwhile is released). An acquire of a one-server lock
        interrupted as the process goes away (KeyboardInterrupt, SystemExit) gives back
        what it may have taken within half a second (a Redlock's: within its node
        timeout); what a server that does not answer keeps by then expires on its own.
        """
        lease = self._acquire(args.timeout(timeout), wait=True)
        if lease is None:
            raise AcquireTimeout(f"{self._noun} {self.name!r} still busy after {timeout}s")
        return lease

    def try_acquire(self) -> LeaseT | None:
        """Take the lock if it is free right now; never waits. None if it is busy.

        Raises BackendError if the server fails (a Redlock: QuorumError if too few nodes
        answered), and LockLost if a ``reentrant`` holder's lease was lost meanwhile.
        Against a server that is down or does not answer it raises within 2 seconds,
        whatever the ttl and the client's retry policy (a connection failure is tried
        again once, at once); with ``replicas=``, add the wait for them. A Cluster
        client's calls keep its own timeouts and retries.
        """
        return self._acquire(0.0, wait=False)

    def _acquire(self, timeout: float | None, *, wait: bool) -> LeaseT | None:
        if self._holding is None:
            return self._take(timeout, wait=wait)
        holder = current_holder()
        held = self._held_by(holder)
        if held is not None:
            return held  # type: ignore[return-value]
        lease = self._take(timeout, wait=wait)
        if lease is not None:
            self._hold(holder, lease)
        return lease

    def _take(self, timeout: float | None, *, wait: bool) -> LeaseT | None:
        started = _metrics.now()
        attempt = self._new_attempt(timeout, wait=wait)  # (its deadline counts the look)
        grant = self._attempted(attempt)
        if grant is None:
            self._not_granted(started, wait=wait)
            return None
        return self._handed(attempt, grant, started)

    def _attempted(self, attempt: Attempt) -> Grant | None:
        """Run ``attempt`` (after the one look at the server); clean up after it if it
        is interrupted once something reached the server."""
        self._io.check_server_once(attempt.look_within())
        try:
            return self._io.run(attempt.run(), f"acquire {self.name!r}")
        except BaseException as exc:
            if attempt.outstanding:
                # An interruption that ends the process (Ctrl-C, exit, a signal's error:
                # not an Exception, nor asyncio's cancellation) is cleaned up in haste.
                self._abandon(attempt, hurried=not isinstance(exc, (Exception, Cancelled)))
            raise

    def _handed(self, attempt: Attempt, grant: Grant, started: float) -> LeaseT:
        """The lease of ``attempt``'s grant (``_watched``). Interrupted before the caller
        has it (an error raised by a signal handler while its renewal starts), the grant
        is given back as an interrupted attempt's is: no one else could release it."""
        try:
            return self._watched(grant, started)
        except BaseException as exc:
            self._abandon(attempt, hurried=not isinstance(exc, (Exception, Cancelled)))
            raise

    def _watched(self, grant: Grant, started: float) -> LeaseT:
        lease = self._new_lease(grant)
        try:
            self._opened(lease, started)
            if self._auto_renew:
                _renewer_sync.watch(lease, self._io, self._max_hold)
            elif self._watches:
                _renewer_sync.watch(lease, self._io, 0.0)  # watch its validity, never renew
        except BaseException:
            unhanded(lease)
            raise
        return lease

    def _abandon(self, attempt: Attempt, *, hurried: bool = False) -> None:
        try:
            shielded(
                lambda: self._io.run(attempt.abandon(hurried=hurried), f"clean up {self.name!r}")
            )
        except Exception:
            pass  # the original error matters more; an orphaned key expires with its ttl
        except Cancelled:
            pass  # cancelled again while cleaning up; the clean-up itself ran to its end

    def __enter__(self) -> LeaseT:
        holder = current_holder()
        if self._refuses_nesting and self._holding is None:
            refuse_nested(self, holder)
        lease = self.acquire()
        push_entered(self, lease, holder)
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = pop_entered(self)
        if lease is not None:
            assert isinstance(lease, SyncLeaseBlock)
            lease.__exit__(exc_type, exc, tb)

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """``@lock``: each call of ``fn`` runs holding the lock, as in a block of the lock
        (asyncio: ``fn`` is a coroutine function, run to its end), and raises what that
        raises. A function whose work would run after the lock is given back (a generator
        function; for a blocking lock, a coroutine function) is refused
        (InvalidArgument)."""
        return decorate(self, fn)


def handed_out(front: SyncFront[LeaseT], grant: Grant, started: float) -> LeaseT:
    """The lease of a grant that ``front``'s lock got in another way (a multi-lock's one
    script): watched, renewed and metered as its own acquire's would be."""
    return front._watched(grant, started)
