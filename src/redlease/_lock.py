"""``Lock`` and ``AsyncLock``: a lock name on one Redis/Valkey deployment (standalone,
Sentinel-managed or Cluster). Twins: the same arguments and methods in the same order;
the rules live in ``_flows``, the I/O in ``_io_sync``/``_io_async``.

A lock object holds no ownership state: each acquisition returns its own lease, so one
``Lock`` may be shared by many threads (or tasks). ``with lock as lease`` remembers the
lease it opened in a context variable (per thread, per task), so nested and concurrent
blocks each release their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable
from contextvars import ContextVar
from datetime import timedelta
from types import TracebackType
from typing import Any, Generic, TypeVar

from . import _arguments as args
from . import _batches, _flows, _renewal
from ._batches import Lender
from ._errors import AcquireTimeout, InvalidArgument, LockLost
from ._flows import DEFAULT_BATCH_WINDOW, Acquisition, Grant, LockSpec
from ._io_async import AsyncIO
from ._io_sync import SyncIO
from ._lease import AsyncLease, Lease, LeaseState, _shielded
from ._timing import Clock

Seconds = float | timedelta
OnLost = Callable[[Any], object]

log = logging.getLogger("redlease")

# Leases opened by `with lock` / `async with lock` in this context, innermost last.
_entered: ContextVar[tuple[tuple[object, LeaseState], ...]] = ContextVar(
    "redlease_entered", default=()
)


def _push(lock: object, lease: LeaseState) -> None:
    _entered.set((*_entered.get(), (lock, lease)))


def _pop(lock: object) -> LeaseState:
    stack = _entered.get()
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][0] is lock:
            _entered.set(stack[:i] + stack[i + 1 :])
            return stack[i][1]
    raise RuntimeError("exiting a lock's `with` block that did not enter it")


LeaseT = TypeVar("LeaseT", bound=LeaseState)


class _Front(Generic[LeaseT]):
    """What a front needs from the lock it serves (set by the lock's own classes)."""

    _io: Any
    _attempt_class: Any
    _lease_class: type[LeaseT]
    _spec: Any
    _auto_renew: bool
    _on_lost: OnLost | None
    _max_hold: float | None
    _lender: Lender | None = None  # a Lock with batch > 1 lends its grants

    @property
    def name(self) -> str:  # the lock's own config class says
        raise NotImplementedError

    def _lease_for(self, grant: Grant) -> LeaseT:
        lease = self._lease_class(self._spec, grant, self._io, self._on_lost)  # type: ignore[call-arg]
        lease._lender = self._lender
        return lease


def _given_back(name: str, failure: BaseException | None) -> None:
    """How giving back a batch's grant ended (no caller waits for it: it is logged)."""
    if isinstance(failure, LockLost):
        log.warning("batch of lock %r: its grant was lost on the server before it ended", name)
    elif failure is not None:
        log.warning(
            "batch of lock %r: giving its grant back failed (%s); it expires with its ttl",
            name,
            failure,
        )


class _SyncFront(_Front[LeaseT]):
    """``acquire``, ``try_acquire`` and ``with``, once for ``Lock`` and ``Redlock``. A
    subclass sets its driver (``_io``: runs flows, checks its servers once), the attempt
    it makes (``_attempt_class``: ``run()``, ``abandon()``, ``outstanding``) and the
    lease it hands out (``_lease_class``)."""

    def acquire(self, timeout: Seconds | None = None) -> LeaseT:
        """Wait until the lock is ours and return the lease.

        ``timeout`` bounds the wait in seconds (None: no bound; 0: a single try).
        Raises AcquireTimeout if the lock stayed busy (a Redlock: QuorumError if too few
        nodes answered).
        """
        lease = self._acquire(args.timeout(timeout), wait=True)
        if lease is None:
            raise AcquireTimeout(f"lock {self.name!r} still busy after {timeout}s")
        return lease

    def try_acquire(self) -> LeaseT | None:
        """Take the lock if it is free right now; never waits. None if it is busy."""
        return self._acquire(0.0, wait=False)

    def _acquire(self, timeout: float | None, *, wait: bool) -> LeaseT | None:
        lender = self._lender
        if lender is not None:
            lent, closed = lender.lend()
            if closed is not None:
                self._give_back(closed)
            if lent is not None:
                return self._watched(self._lease_for(lent))
        self._io.check_server_once()
        attempt = self._attempt_class(self._spec, timeout, wait=wait)
        try:
            grant = self._io.run(attempt.run(), f"acquire {self.name!r}")
        except BaseException:
            if attempt.outstanding:
                # The original error matters more; an orphaned key expires with its ttl.
                with contextlib.suppress(Exception):
                    self._io.run(attempt.abandon(), f"clean up {self.name!r}")
            raise
        if grant is None:
            return None
        if lender is not None:
            lender.granted(grant)
        return self._watched(self._lease_for(grant))

    def _give_back(self, token: str) -> None:
        """Release a batch's grant for real (its window ended with it parked)."""
        failure: BaseException | None = None
        try:
            self._io.run(_flows.release(self._spec, token), f"release {self.name!r}")
        except Exception as exc:
            failure = exc
        _given_back(self.name, failure)

    def _watched(self, lease: LeaseT) -> LeaseT:
        if self._auto_renew:
            _renewal.watch(lease, self._io, self._max_hold)
        return lease

    def __enter__(self) -> LeaseT:
        lease = self.acquire()
        _push(self, lease)
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = _pop(self)
        assert isinstance(lease, self._lease_class)
        lease.__exit__(exc_type, exc, tb)  # type: ignore[attr-defined]


class _AsyncFront(_Front[LeaseT]):
    """The asyncio twin of ``_SyncFront``, once for ``AsyncLock`` and ``AsyncRedlock``;
    also ``cancel_on_lost``."""

    _cancel_on_lost: bool
    _giving_back: set[asyncio.Task[None]]

    async def acquire(self, timeout: Seconds | None = None) -> LeaseT:
        """Wait until the lock is ours and return the lease.

        ``timeout`` bounds the wait in seconds (None: no bound; 0: a single try).
        Raises AcquireTimeout if the lock stayed busy (a Redlock: QuorumError if too few
        nodes answered). Cancelling the caller at any point leaves no lock behind: a
        lock granted meanwhile is released.
        """
        lease = await self._acquire(args.timeout(timeout), wait=True)
        if lease is None:
            raise AcquireTimeout(f"lock {self.name!r} still busy after {timeout}s")
        return lease

    async def try_acquire(self) -> LeaseT | None:
        """Take the lock if it is free right now; never waits. None if it is busy."""
        return await self._acquire(0.0, wait=False)

    async def _acquire(self, timeout: float | None, *, wait: bool) -> LeaseT | None:
        lender = self._lender
        if lender is not None:
            lent, closed = lender.lend()
            if closed is not None:
                await _shielded(self._give_back(closed))
            if lent is not None:
                return self._watched(self._lease_for(lent))
        await self._io.check_server_once()
        attempt = self._attempt_class(self._spec, timeout, wait=wait)
        try:
            grant = await self._io.run(attempt.run(), f"acquire {self.name!r}")
        except BaseException:
            if attempt.outstanding:
                await self._abandon(attempt)
            raise
        if grant is None:
            return None
        if lender is not None:
            lender.granted(grant)
        return self._watched(self._lease_for(grant))

    async def _give_back(self, token: str) -> None:
        """Release a batch's grant for real (its window ended with it parked)."""
        failure: BaseException | None = None
        try:
            await self._io.run(_flows.release(self._spec, token), f"release {self.name!r}")
        except Exception as exc:
            failure = exc
        _given_back(self.name, failure)

    def _give_back_soon(self, token: str) -> None:
        """The batch timer's release (it runs in the loop, which has to do the I/O)."""
        task = asyncio.get_running_loop().create_task(self._give_back(token))
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    def _watched(self, lease: LeaseT) -> LeaseT:
        if self._cancel_on_lost:
            lease._holder = asyncio.current_task()  # type: ignore[attr-defined]
        if self._auto_renew:
            _renewal.watch_async(lease, self._io, self._max_hold)
        elif self._cancel_on_lost:
            _renewal.watch_async(lease, self._io, 0.0)  # watch its validity, never renew
        return lease

    async def _abandon(self, attempt: Any) -> None:
        try:
            await _shielded(self._io.run(attempt.abandon(), f"clean up {self.name!r}"))
        except Exception:
            pass  # the original error matters more; an orphaned key expires with its ttl
        except asyncio.CancelledError:
            pass  # cancelled again while cleaning up; the clean-up itself ran to its end

    async def __aenter__(self) -> LeaseT:
        lease = await self.acquire()
        _push(self, lease)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = _pop(self)
        assert isinstance(lease, self._lease_class)
        await lease.__aexit__(exc_type, exc, tb)  # type: ignore[attr-defined]


def _is_async_client(client: object) -> bool:
    return inspect.iscoroutinefunction(getattr(client, "execute_command", None))


def _check_client(client: object, *, want_async: bool) -> None:
    if not callable(getattr(client, "execute_command", None)):
        raise InvalidArgument(f"client must be a redis-py client, not {type(client).__name__}")
    if _is_async_client(client) != want_async:
        if want_async:
            raise InvalidArgument(
                "client must be a redis.asyncio client for AsyncLock; use Lock with a sync client"
            )
        raise InvalidArgument(
            "client must be a sync redis client for Lock; use AsyncLock with a redis.asyncio client"
        )


class _LockConfig:
    """Arguments shared by the twins, checked once."""

    def __init__(
        self,
        name: object,
        ttl: object,
        *,
        fair: object,
        auto_renew: object,
        on_lost: object,
        max_hold: object,
        prefix: object,
        clock: Clock | None,
        replicas: object = 0,
        replica_timeout: object = None,
        batch: object = 1,
        batch_window: object = DEFAULT_BATCH_WINDOW,
    ) -> None:
        self._spec = LockSpec.create(
            name,
            ttl,
            fair=fair,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
            batch=batch,
            batch_window=batch_window,
        )
        self._auto_renew = args.flag(auto_renew, "auto_renew")
        self._on_lost: OnLost | None = args.callback(on_lost, "on_lost")  # type: ignore[assignment]
        self._max_hold = args.optional_positive(max_hold, "max_hold")

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def ttl(self) -> float:
        return self._spec.ttl

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl}s>"


class Lock(_LockConfig, _SyncFront[Lease]):
    """A distributed lock on one Redis/Valkey deployment (sync).

    ``ttl`` is the lease length; ``fair`` serves waiters in arrival order (no barging);
    ``on_lost(lease)`` is called once if a held lease is found lost.

    ``replicas=n`` makes each grant and extension count only once ``n`` replicas have
    acknowledged it (``WAIT``, at most ``replica_timeout`` seconds, default a tenth of the
    ttl); otherwise the lock is given back and ``BackendError`` raised. It narrows, not
    closes, the window in which a failover to an asynchronous replica loses the lock.

    ``auto_renew`` keeps each lease alive while held: the process's one renewer thread
    extends it well before it runs out and, if it is taken over or cannot be renewed in
    time, marks it lost (``lease.lost``, ``check()`` raises ``LockLost``) and calls
    ``on_lost(lease)`` from that thread (keep the callback short) no later than the end
    of its validity. ``max_hold`` (seconds) stops renewal that long after acquisition,
    so a hung holder cannot keep the lock forever. A lease that is never released keeps
    being renewed (until ``max_hold``).

    ``batch=n`` (fair only) lends each grant to this object's callers for up to ``n``
    holds within ``batch_window`` seconds: a hold's release keeps the grant and the next
    acquire takes it without a round trip, with a new lease and fence; then it goes to the
    next waiter (see ``_batches``).
    """

    _attempt_class = Acquisition
    _lease_class = Lease

    def __init__(
        self,
        client: Any,
        name: str,
        ttl: Seconds = 10.0,
        *,
        fair: bool = True,
        auto_renew: bool = False,
        on_lost: OnLost | None = None,
        max_hold: Seconds | None = None,
        prefix: str = "",
        clock: Clock | None = None,
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
        batch: int = 1,
        batch_window: Seconds = DEFAULT_BATCH_WINDOW,
    ) -> None:
        _check_client(client, want_async=False)
        super().__init__(
            name,
            ttl,
            fair=fair,
            auto_renew=auto_renew,
            on_lost=on_lost,
            max_hold=max_hold,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
            batch=batch,
            batch_window=batch_window,
        )
        self._io = SyncIO(client)
        if self._spec.batch > 1:
            self._lender = Lender(self._spec, _batches.CLOSER.schedule, self._give_back)
        if self._spec.replicas is not None and not self._io.direct:
            raise InvalidArgument(
                "replicas needs a plain redis.Redis client (standalone or Sentinel): WAIT "
                "must run on the connection that made the write"
            )


class AsyncLock(_LockConfig, _AsyncFront[AsyncLease]):
    """A distributed lock on one Redis/Valkey deployment (asyncio twin of ``Lock``).

    With ``auto_renew`` the running event loop's one renewer task keeps leases alive
    (see ``Lock``); ``on_lost`` runs in that loop. ``cancel_on_lost=True`` also cancels
    the task that acquired the lease when the lease is lost (unless that task is the one
    that found out, through ``extend``, ``release`` or ``lost``), so protected work stops
    at its next ``await``; without ``auto_renew`` it still fires when validity runs out.
    """

    _attempt_class = Acquisition
    _lease_class = AsyncLease

    def __init__(
        self,
        client: Any,
        name: str,
        ttl: Seconds = 10.0,
        *,
        fair: bool = True,
        auto_renew: bool = False,
        on_lost: OnLost | None = None,
        max_hold: Seconds | None = None,
        cancel_on_lost: bool = False,
        prefix: str = "",
        clock: Clock | None = None,
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
        batch: int = 1,
        batch_window: Seconds = DEFAULT_BATCH_WINDOW,
    ) -> None:
        _check_client(client, want_async=True)
        super().__init__(
            name,
            ttl,
            fair=fair,
            auto_renew=auto_renew,
            on_lost=on_lost,
            max_hold=max_hold,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
            batch=batch,
            batch_window=batch_window,
        )
        self._io = AsyncIO(client)
        if self._spec.replicas is not None and not self._io.direct:
            raise InvalidArgument(
                "replicas needs a plain redis.Redis client (standalone or Sentinel): WAIT "
                "must run on the connection that made the write"
            )
        self._cancel_on_lost = args.flag(cancel_on_lost, "cancel_on_lost")
        self._giving_back = set()
        if self._spec.batch > 1:
            self._lender = Lender(self._spec, _batches.in_loop, self._give_back_soon)
