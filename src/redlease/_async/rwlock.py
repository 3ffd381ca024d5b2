"""``AsyncReadWriteLock``: many readers or one writer, each side a lock of its own over the
shared-hold scripts (the rules, nesting included, are in ``_rules.rwlock``). Written once, as
asyncio code; ``scripts/unasync.py`` generates the blocking twin (``ReadWriteLock``).
"""

from __future__ import annotations

from typing import Any

from .._base.types import Clock, OnLost, Seconds
from .._clients.checks import check_client
from .._rules import arguments as args
from .._rules.flows import READ_WRITE, Acquisition, LockSpec
from .._rules.fronts import Opening
from .._rules.lease import Holders
from .._rules.lock import Named, check_replicas
from .._rules.rwlock import READ, READERS, WRITE, Shared, SideRules
from .backend import ASYNC, current_holder
from .io import AsyncIO
from .lease import AsyncLease
from .lock import AsyncOneServer


class AsyncReadWriteSide(SideRules, AsyncOneServer):
    """One side of a read/write lock, ``rw.read`` or ``rw.write``: a lock of its own to
    its caller, with the surface of ``Lock`` (``acquire``, ``try_acquire``, ``with``,
    ``locked``, ``owned``, ``waiting``, a decorator), handing out ``Lease`` objects."""

    def __init__(self, rw: AsyncReadWriteLock, shared: Shared, mode: str, io: AsyncIO) -> None:
        self._join(rw, shared, mode)
        self._io = io
        self._cancel_on_lost = shared.cancel_on_lost  # unasync: async only

    def _new_attempt(self, timeout: float | None, *, wait: bool) -> Acquisition:
        return self._attempt_by(current_holder(), timeout, wait)

    async def _acquire(
        self, timeout: float | None, *, wait: bool, entering: Opening | None = None
    ) -> AsyncLease | None:
        lease = await super()._acquire(timeout, wait=wait, entering=entering)
        if lease is None:  # (a lease goes back with no call between: see _granted)
            self._refused(current_holder(), lease, wait)
        return lease


class AsyncReadWriteLock(Named):
    """Many readers or one writer of ``name``, on one Redis/Valkey deployment.

    ``rw.read`` and ``rw.write`` behave like a ``Lock``: ``with rw.read as lease``,
    ``rw.write.acquire(timeout=)``, ``try_acquire()``; each lease has ``fence``,
    ``extend()``, ``release()``, ``lost``, ``check()``. Waiters are served in arrival
    order: readers that come after a waiting writer wait behind it. A write lease's
    fence is greater than every lease's before it, read or write.

    A holder (the thread; asyncio: the task) that holds a lease of this object and
    acquires again is served at once: the same mode gives its lease one hold more, a read
    inside its write is a downgrade, a write inside its read an upgrade if its read is the
    only lease held (otherwise ``LockError``; ``try_acquire`` returns None).
    ``auto_renew``, ``on_lost``, ``max_hold``, ``prefix``, ``clock``, ``replicas``,
    ``replica_timeout`` (and asyncio's ``cancel_on_lost``) work as for ``Lock``.
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
        cancel_on_lost: bool = False,  # unasync: async only
        prefix: str = "redlease:",
        clock: Clock | None = None,
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
    ) -> None:
        check_client(client, want_async=ASYNC, sync_twin="ReadWriteLock")
        specs = {
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
        auto_renew, max_hold = args.renewal(auto_renew, max_hold, clock)
        shared = Shared(
            specs,
            {mode: Holders() for mode in (READ, WRITE)},  # each holder's lease
            auto_renew,
            max_hold,
            args.callback(on_lost, "on_lost"),
            args.flag(cancel_on_lost, "cancel_on_lost"),  # unasync: async only
        )
        io = AsyncIO(client)
        check_replicas(specs[READ], io.direct)
        self._spec = specs[READ]  # (its name and ttl, both sides')
        self._read = AsyncReadWriteSide(self, shared, READ, io)
        self._write = AsyncReadWriteSide(self, shared, WRITE, io)

    @property
    def read(self) -> AsyncReadWriteSide:
        """The read side: shared leases, as many at once as are asked for while no
        writer holds, nor waits before them."""
        return self._read

    @property
    def write(self) -> AsyncReadWriteSide:
        """The write side: one exclusive lease at a time, while nothing else is held."""
        return self._write

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl}s>"
