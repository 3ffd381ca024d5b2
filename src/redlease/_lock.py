"""``Lock`` and ``AsyncLock``: a lock name on one Redis/Valkey deployment (standalone,
Sentinel-managed or Cluster). Twins: the same arguments and methods in the same order;
the rules live in ``_flows``, the I/O in ``_io_sync``/``_io_async``, what a caller
sees in ``_fronts``.

A lock object holds no ownership state: each acquisition returns its own lease, so one
``Lock`` may be shared by many threads (or tasks).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from . import _arguments as args
from . import _inspect
from ._errors import InvalidArgument
from ._flows import Acquisition, Flow, Grant, LockSpec
from ._fronts import AsyncFront, SyncFront, check_client
from ._inspect import LockInfo
from ._io_async import AsyncIO
from ._io_sync import SyncIO
from ._keys import DEFAULT_PREFIX
from ._lease import Acquired, AsyncLease, Holders, Lease
from ._timing import Clock

Seconds = float | timedelta
OnLost = Callable[[Any], object]


class _LockConfig:
    """Arguments shared by the twins, checked once."""

    _refuses_nesting = True  # see _fronts._refuse_nested

    def __init__(
        self,
        name: object,
        ttl: object,
        *,
        fair: object,
        auto_renew: object,
        on_lost: object,
        max_hold: object,
        reentrant: object,
        prefix: object,
        clock: Clock | None,
        replicas: object = 0,
        replica_timeout: object = None,
    ) -> None:
        self._spec = LockSpec.create(
            name,
            ttl,
            fair=fair,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        self._auto_renew, self._max_hold = args.renewal(auto_renew, max_hold, clock)
        self._on_lost: OnLost | None = args.callback(on_lost, "on_lost")  # type: ignore[assignment]
        if args.flag(reentrant, "reentrant"):
            self._holding: Holders | None = Holders()

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._spec.name

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._spec.ttl

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl}s>"


def check_replicas(spec: LockSpec, direct: bool) -> None:
    if spec.replicas is not None and not direct:
        raise InvalidArgument(
            "replicas needs a standalone client (redis.Redis, valkey.Valkey; or Sentinel's): "
            "WAIT must run on the connection that made the write"
        )


class _Looked:
    """What ``OneServer`` and its twin share to answer ``locked()``, ``owned()`` and
    ``waiting()``: the INSPECT flow (see ``_inspect``) and the leases each holder took."""

    _spec: LockSpec
    _acquired: Acquired | None = None

    def _look(self) -> Flow[LockInfo]:
        spec = self._spec
        kind = _inspect.kind_of(spec.kind)
        return _inspect.inspect(spec.keys, spec.name, kind, spec.reply_timeout)

    def _acquirers(self) -> Acquired:
        acquired = self._acquired
        if acquired is None:  # (setdefault: two threads' first acquires keep one table)
            acquired = self.__dict__.setdefault("_acquired", Acquired())
        return acquired


class OneServer(_Looked, SyncFront[Lease]):
    """What ``Lock`` and ``Semaphore`` share: one deployment, the one-server flows."""

    _io: SyncIO
    _spec: LockSpec
    _on_lost: OnLost | None

    def _serve(self, client: Any) -> None:
        self._io = SyncIO(client)
        check_replicas(self._spec, self._io.direct)

    def _new_attempt(self, timeout: float | None, *, wait: bool) -> Acquisition:
        return Acquisition(self._spec, timeout, wait=wait)

    def _new_lease(self, grant: Grant) -> Lease:
        lease = Lease(self._spec, grant, self._io, self._on_lost)
        self._acquirers().note(threading.current_thread(), lease)
        return lease

    def locked(self) -> bool:
        """Whether anyone holds it now, as the server says (a semaphore: any permit; a
        read/write lock's side: any lease, read or write). One round trip. A snapshot:
        to act on "free", take it (``try_acquire``), never test first. Raises
        BackendError if the server cannot answer."""
        return self._io.run(self._look(), f"inspect {self.name!r}").held

    def owned(self) -> bool:
        """Whether the calling thread holds a lease of this object that is still its
        own on the server now: one it acquired (lent to other threads or not), has not
        released, does not know lost, and whose token the server lists as a holder. No
        round trip when it holds none. Raises BackendError if the server cannot
        answer."""
        tokens = self._acquirers().tokens(threading.current_thread())
        if not tokens:
            return False
        info = self._io.run(self._look(), f"inspect {self.name!r}")
        return any(holder.token in tokens for holder in info.holders)

    def waiting(self) -> int:
        """How many waiters are queued and live now (within their deadline, on the
        server's clock); waiters that gave up or died are not counted. Raises
        BackendError if the server cannot answer."""
        return self._io.run(self._look(), f"inspect {self.name!r}").live_waiters


class AsyncOneServer(_Looked, AsyncFront[AsyncLease]):
    """The asyncio twin of ``OneServer``."""

    _io: AsyncIO
    _spec: LockSpec
    _on_lost: OnLost | None

    def _serve(self, client: Any) -> None:
        self._io = AsyncIO(client)
        check_replicas(self._spec, self._io.direct)

    def _new_attempt(self, timeout: float | None, *, wait: bool) -> Acquisition:
        return Acquisition(self._spec, timeout, wait=wait)

    def _new_lease(self, grant: Grant) -> AsyncLease:
        lease = AsyncLease(self._spec, grant, self._io, self._on_lost)
        self._acquirers().note(asyncio.current_task(), lease)
        return lease

    async def locked(self) -> bool:
        """The asyncio twin of ``Lock.locked()``."""
        return (await self._io.run(self._look(), f"inspect {self.name!r}")).held

    async def owned(self) -> bool:
        """The asyncio twin of ``Lock.owned()``: the calling task's leases."""
        tokens = self._acquirers().tokens(asyncio.current_task())
        if not tokens:
            return False
        info = await self._io.run(self._look(), f"inspect {self.name!r}")
        return any(holder.token in tokens for holder in info.holders)

    async def waiting(self) -> int:
        """The asyncio twin of ``Lock.waiting()``."""
        return (await self._io.run(self._look(), f"inspect {self.name!r}")).live_waiters


class Lock(_LockConfig, OneServer):
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

    ``reentrant=True`` lets the thread that holds a lease acquire the lock again without
    waiting for itself: ``acquire``, ``try_acquire`` and ``with`` return the lease it
    holds, one hold more (``lease.hold_count``); each release takes one hold off and the
    last one releases on the server. If that lease was lost meanwhile, acquiring again
    raises ``LockLost`` (once; the next acquire takes the lock anew). A lease handed to
    another thread still counts as its acquirer's.

    Raises InvalidArgument, naming the argument, for an argument out of its range or a
    client it cannot serve.
    """

    _io: SyncIO

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
        reentrant: bool = False,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
    ) -> None:
        check_client(client, want_async=False)
        super().__init__(
            name,
            ttl,
            fair=fair,
            auto_renew=auto_renew,
            on_lost=on_lost,
            max_hold=max_hold,
            reentrant=reentrant,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        self._serve(client)


class AsyncLock(_LockConfig, AsyncOneServer):
    """A distributed lock on one Redis/Valkey deployment (asyncio twin of ``Lock``).

    With ``auto_renew`` the running event loop's one renewer task keeps leases alive
    (see ``Lock``); ``on_lost`` runs in that loop. ``cancel_on_lost=True`` also cancels
    the task that acquired the lease when the lease is lost (unless that task is the one
    that found out, through ``extend``, ``release`` or ``lost``), so protected work stops
    at its next ``await``; without ``auto_renew`` it still fires when validity runs out.
    ``reentrant=True`` works per task, where ``Lock``'s works per thread.
    """

    _io: AsyncIO

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
        reentrant: bool = False,
        cancel_on_lost: bool = False,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
    ) -> None:
        check_client(client, want_async=True)
        super().__init__(
            name,
            ttl,
            fair=fair,
            auto_renew=auto_renew,
            on_lost=on_lost,
            max_hold=max_hold,
            reentrant=reentrant,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        self._serve(client)
        self._cancel_on_lost = args.flag(cancel_on_lost, "cancel_on_lost")
