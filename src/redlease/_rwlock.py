"""``ReadWriteLock`` and ``AsyncReadWriteLock``: many readers or one writer. Each has a
``read`` and a ``write`` side that behave like a ``Lock`` (``acquire``, ``try_acquire``,
``with``), over the shared-hold scripts a ``Semaphore`` runs too (``_scripts``): read
leases are shared holds, a write lease an exclusive one, all served in arrival order, so
a waiting writer holds back the readers that come after it and is never starved. One
fence counter serves both sides: a writer's fence is greater than every earlier lease's.

A holder (thread, or asyncio task) that asks a read/write lock object for a lease while
it holds one of that object is served at once, as Redisson's, kazoo's and aiorwlock's
read/write locks serve it, never by waiting for itself:

* the same mode again (a read inside its read, a write inside its write): the lease it
  holds, one hold more (``hold_count``); only the outermost release releases it. A read
  inside a read is never held up by a writer queued behind the first;
* a read inside its write (a downgrade): a read lease of its own, granted at once next
  to the write; once the write is released the holder still reads, and other readers
  may enter;
* a write inside its read (an upgrade): granted at once if its read is the only lease
  held; otherwise ``acquire`` raises ``LockError`` (waiting for the other readers could
  deadlock with another holder upgrading the same way) and ``try_acquire`` returns None.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

from . import _arguments as args
from ._errors import LockError
from ._flows import READ_WRITE, Acquisition, LockSpec
from ._fronts import check_client
from ._io_async import AsyncIO
from ._io_sync import SyncIO
from ._keys import DEFAULT_PREFIX
from ._lease import Holders, LeaseState
from ._lease_async import AsyncLease
from ._lease_sync import Lease
from ._lock import OnLost, check_replicas
from ._lock_async import AsyncOneServer
from ._lock_sync import OneServer
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
                kind=READ_WRITE,
                extra=(str(READERS), mode),
            )
            for mode in (READ, WRITE)
        }
        self._auto_renew, self._max_hold = args.renewal(auto_renew, max_hold, clock)
        self._on_lost: OnLost | None = args.callback(on_lost, "on_lost")  # type: ignore[assignment]
        self._tables = {mode: Holders() for mode in (READ, WRITE)}  # each holder's lease

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._specs[READ].name

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._specs[READ].ttl

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl}s>"


class _Side:
    """What a side needs of its read/write lock: its spec, options and name."""

    _metric_mode: str | None

    _spec: LockSpec
    _noun: str
    _holding: Holders | None

    def _join(self, rw: _ReadWriteConfig, mode: str) -> None:
        self._rw, self._mode = rw, mode
        self._spec = rw._specs[mode]
        self._holding = rw._tables[mode]  # the same mode again: one hold more (_fronts)
        self._other = rw._tables[WRITE if mode == READ else READ]
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

    def _other_lease(self, holder: object) -> LeaseState | None:
        """The lease of the other mode ``holder`` holds, if it still does."""
        lease = self._other.held(holder)
        return None if lease is None or lease.lost else lease

    def _attempt_by(self, holder: object, timeout: float | None, wait: bool) -> Acquisition:
        other = self._other_lease(holder)
        if other is None:
            return Acquisition(self._spec, timeout, wait=wait)
        # a downgrade, or an upgrade, which is granted at once or not at all (never queued)
        waits = wait and self._mode == READ
        return Acquisition(self._spec, timeout, wait=waits, also=(other.token,))

    def _refused(self, holder: object, lease: LeaseState | None, wait: bool) -> None:
        """An upgrade the server refused (other readers hold it) raises for ``acquire``;
        ``try_acquire`` returns None."""
        if lease is None and wait and self._mode == WRITE and self._other_lease(holder):
            raise LockError(
                f"read/write lock {self.name!r}: this holder's read lease is not the only "
                "one held, so it cannot be upgraded to a write lease at once, and waiting "
                "for the other readers could deadlock with one of them upgrading too: "
                "release the read lease first"
            )

    def __repr__(self) -> str:
        return f"<{_SIDES[self._mode]} side of {self._rw!r}>"


class _SyncSide(_Side, OneServer):
    def __init__(self, rw: _ReadWriteConfig, mode: str, io: SyncIO) -> None:
        self._join(rw, mode)
        self._io = io

    def _new_attempt(self, timeout: float | None, *, wait: bool) -> Acquisition:
        return self._attempt_by(threading.current_thread(), timeout, wait)

    def _acquire(self, timeout: float | None, *, wait: bool) -> Lease | None:
        lease = super()._acquire(timeout, wait=wait)
        self._refused(threading.current_thread(), lease, wait)
        return lease


class _AsyncSide(_Side, AsyncOneServer):
    def __init__(self, rw: _ReadWriteConfig, mode: str, io: AsyncIO, cancel: bool) -> None:
        self._join(rw, mode)
        self._io = io
        self._cancel_on_lost = cancel

    def _new_attempt(self, timeout: float | None, *, wait: bool) -> Acquisition:
        return self._attempt_by(asyncio.current_task(), timeout, wait)

    async def _acquire(self, timeout: float | None, *, wait: bool) -> AsyncLease | None:
        lease = await super()._acquire(timeout, wait=wait)
        self._refused(asyncio.current_task(), lease, wait)
        return lease


class ReadWriteLock(_ReadWriteConfig):
    """Many readers or one writer of ``name``, on one Redis/Valkey deployment (sync).

    ``rw.read`` and ``rw.write`` behave like a ``Lock``: ``with rw.read as lease``,
    ``rw.write.acquire(timeout=)``, ``try_acquire()``; each lease has ``fence``,
    ``extend()``, ``release()``, ``lost``, ``check()``. Waiters are served in arrival
    order: readers that come after a waiting writer wait behind it. A write lease's
    fence is greater than every lease's before it, read or write.

    A thread that holds a lease of this object and acquires again is served at once:
    the same mode gives its lease one hold more, a read inside its write is a downgrade,
    a write inside its read an upgrade if its read is the only lease held (otherwise
    ``LockError``; ``try_acquire`` returns None). See the module's notes.
    ``auto_renew``, ``on_lost``, ``max_hold``, ``prefix``, ``clock``, ``replicas`` and
    ``replica_timeout`` work as for ``Lock``.
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
    """Many readers or one writer (asyncio twin of ``ReadWriteLock``); the holder whose
    leases nest is the task. ``cancel_on_lost`` as for ``AsyncLock``."""

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
