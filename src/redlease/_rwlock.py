"""``ReadWriteLock`` and ``AsyncReadWriteLock``: many readers or one writer. Each has a
``read`` and a ``write`` side that behave like a ``Lock`` (``acquire``, ``try_acquire``,
``with``), over the shared-hold scripts a ``Semaphore`` runs too (``_scripts``): read
leases are shared holds, a write lease an exclusive one, all served in arrival order, so
a waiting writer holds back the readers that come after it and is never starved. One
fence counter serves both sides: a writer's fence is greater than every earlier lease's.

A holder (thread, or asyncio task) that holds a lease of a read/write lock object and
asks that object for another is refused with ``LockError``: an upgrade (read, then
write) would wait for its own read lease forever, a read under its own write lease too,
and a second read could wait behind a writer that waits for the first.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

from . import _arguments as args
from ._errors import LockError
from ._flows import READ_WRITE, LockSpec
from ._fronts import check_client
from ._io_async import AsyncIO
from ._io_sync import SyncIO
from ._keys import DEFAULT_PREFIX
from ._lease import AsyncLease, Holders, Lease, LeaseState
from ._lock import AsyncOneServer, OneServer, OnLost, check_replicas
from ._timing import Clock

Seconds = float | timedelta

READ, WRITE = "r", "w"
# The limit a read lease is granted under: in effect none.
READERS = 1_000_000_000
_SIDES = {READ: "read", WRITE: "write"}


class _ReadWriteConfig:
    """Arguments shared by the twins, checked once; and which holder holds what."""

    def __init__(
        self,
        name: object,
        ttl: object,
        *,
        auto_renew: object,
        on_lost: object,
        max_hold: object,
        prefix: object,
        clock: Clock | None,
        replicas: object,
        replica_timeout: object,
    ) -> None:
        self._specs = {
            mode: LockSpec.create(
                name,
                ttl,
                prefix=prefix,
                clock=clock,
                replicas=replicas,
                replica_timeout=replica_timeout,
                batch=1,
                kind=READ_WRITE,
                extra=(str(READERS), mode),
            )
            for mode in (READ, WRITE)
        }
        self._auto_renew, self._max_hold = args.renewal(auto_renew, max_hold, clock)
        self._on_lost: OnLost | None = args.callback(on_lost, "on_lost")  # type: ignore[assignment]
        self._holding = Holders()  # each holder's lease of ours

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._specs[READ].name

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._specs[READ].ttl

    def _refuse_a_second(self, holder: object, mode: str) -> None:
        lease = self._holding.held(holder)
        if lease is None:
            return
        if lease.lost:  # no longer keeps anyone out
            self._holding.left(holder, lease)
            return
        held = _SIDES[lease._spec.extra[-1]]
        raise LockError(
            f"read/write lock {self.name!r}: this holder holds its {held} lease already; "
            f"a {_SIDES[mode]} acquire could wait for that lease forever (upgrades and "
            f"nested holds are not supported): release the {held} lease first"
        )

    def _note(self, holder: object, lease: LeaseState) -> None:
        self._holding.hold(holder, lease)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl}s>"


class _Side:
    """What a side needs of its read/write lock: its spec, options and name."""

    _metric_mode: str | None

    def _join(self, rw: _ReadWriteConfig, mode: str) -> None:
        self._rw, self._mode = rw, mode
        self._spec = rw._specs[mode]
        self._auto_renew, self._max_hold = rw._auto_renew, rw._max_hold
        self._on_lost = rw._on_lost
        self._noun = f"{_SIDES[mode]} side of read/write lock"
        self._metric_kind, self._metric_mode = "rwlock", _SIDES[mode]

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._spec.name

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._spec.ttl

    def __repr__(self) -> str:
        return f"<{_SIDES[self._mode]} side of {self._rw!r}>"


class _SyncSide(_Side, OneServer):
    def __init__(self, rw: _ReadWriteConfig, mode: str, io: SyncIO) -> None:
        self._join(rw, mode)
        self._io = io

    def _acquire(self, timeout: float | None, *, wait: bool) -> Lease | None:
        holder = threading.current_thread()
        self._rw._refuse_a_second(holder, self._mode)
        lease = super()._acquire(timeout, wait=wait)
        if lease is not None:
            self._rw._note(holder, lease)
        return lease


class _AsyncSide(_Side, AsyncOneServer):
    def __init__(self, rw: _ReadWriteConfig, mode: str, io: AsyncIO, cancel: bool) -> None:
        self._join(rw, mode)
        self._io = io
        self._cancel_on_lost = cancel

    async def _acquire(self, timeout: float | None, *, wait: bool) -> AsyncLease | None:
        holder = asyncio.current_task()
        self._rw._refuse_a_second(holder, self._mode)
        lease = await super()._acquire(timeout, wait=wait)
        if lease is not None:
            self._rw._note(holder, lease)
        return lease


class ReadWriteLock(_ReadWriteConfig):
    """Many readers or one writer of ``name``, on one Redis/Valkey deployment (sync).

    ``rw.read`` and ``rw.write`` behave like a ``Lock``: ``with rw.read as lease``,
    ``rw.write.acquire(timeout=)``, ``try_acquire()``; each lease has ``fence``,
    ``extend()``, ``release()``, ``lost``, ``check()``. Waiters are served in arrival
    order: readers that come after a waiting writer wait behind it. A write lease's
    fence is greater than every lease's before it, read or write.

    A thread that holds a lease of this object and acquires another from it gets
    ``LockError`` (an upgrade from read to write, or any second hold, could wait for
    itself): release first. ``auto_renew``, ``on_lost``, ``max_hold``, ``prefix``,
    ``clock``, ``replicas`` and ``replica_timeout`` work as for ``Lock``.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        ttl: Seconds = 10.0,
        *,
        auto_renew: bool = False,
        on_lost: OnLost | None = None,
        max_hold: Seconds | None = None,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
    ) -> None:
        check_client(client, want_async=False, sync_twin="ReadWriteLock")
        super().__init__(
            name,
            ttl,
            auto_renew=auto_renew,
            on_lost=on_lost,
            max_hold=max_hold,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        io = SyncIO(client)
        check_replicas(self._specs[READ], io.direct)
        self.read = _SyncSide(self, READ, io)
        self.write = _SyncSide(self, WRITE, io)


class AsyncReadWriteLock(_ReadWriteConfig):
    """Many readers or one writer (asyncio twin of ``ReadWriteLock``); the holder that
    may not acquire twice is the task. ``cancel_on_lost`` as for ``AsyncLock``."""

    def __init__(
        self,
        client: Any,
        name: str,
        ttl: Seconds = 10.0,
        *,
        auto_renew: bool = False,
        on_lost: OnLost | None = None,
        max_hold: Seconds | None = None,
        cancel_on_lost: bool = False,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
    ) -> None:
        check_client(client, want_async=True, sync_twin="ReadWriteLock")
        super().__init__(
            name,
            ttl,
            auto_renew=auto_renew,
            on_lost=on_lost,
            max_hold=max_hold,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        io = AsyncIO(client)
        check_replicas(self._specs[READ], io.direct)
        cancel = args.flag(cancel_on_lost, "cancel_on_lost")
        self.read = _AsyncSide(self, READ, io, cancel)
        self.write = _AsyncSide(self, WRITE, io, cancel)
