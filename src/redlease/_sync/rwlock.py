# Generated from _async/rwlock.py by scripts/unasync.py: edit that file, then run
# `python scripts/unasync.py` (the tests run it with --check).
"""``ReadWriteLock``: many readers or one writer, each side a lock of its own over the
shared-hold scripts (the rules, nesting included, are in ``_rules.rwlock``). Written once, as
asyncio code; ``scripts/unasync.py`` generates the blocking twin (``ReadWriteLock``).
"""

from __future__ import annotations

from typing import Any

from .._base.types import Clock, OnLost, Seconds
from .._clients.checks import check_client
from .._rules.flows import READ_WRITE, LockSpec
from .._rules.lease import Holders
from .._rules.rwlock import READ, READERS, SIDES, WRITE, SideCore
from .backend import ASYNC
from .front import Front
from .io import IO, served


class ReadWriteSide(Front):
    """One side of a read/write lock, ``rw.read`` or ``rw.write``: a lock of its own to
    its caller, with the surface of ``Lock`` (``acquire``, ``try_acquire``, ``with``,
    ``locked``, ``owned``, ``waiting``, a decorator), handing out ``Lease`` objects."""

    _core: SideCore

    def __init__(self, rw: ReadWriteLock, core: SideCore, io: IO) -> None:
        super().__init__(core, io)
        self._rw = rw

    def __repr__(self) -> str:
        return f"<{SIDES[self._core.side]} side of {self._rw!r}>"

    def locked(self) -> bool:
        """Whether any lease of the lock is held now, read or write (``Lock.locked``)."""
        return (self._look()).held

    def owned(self) -> bool:
        """Whether the caller holds a lease of this side that is still its own on the
        server now (``Lock.owned``)."""
        return self._owned()

    def waiting(self) -> int:
        """How many waiters of either side are queued and live now (``Lock.waiting``)."""
        return (self._look()).live_waiters


class ReadWriteLock:
    """Many readers or one writer of ``name``, on one Redis/Valkey deployment.

    ``rw.read`` and ``rw.write`` behave like a ``Lock``: ``with rw.read as lease``,
    ``rw.write.acquire(timeout=)``, ``try_acquire()``; each lease has ``fence``,
    ``extend()``, ``release()``, ``lost``, ``check()``. Waiters are served in arrival
    order: readers that come after a waiting writer wait behind it. A write lease's
    fence is greater than every lease's before it, read or write.

    A holder (the thread) that holds a lease of this object and acquires again is served
    at once: the same mode gives its lease one hold more, a read inside its write is a
    downgrade, a write inside its read an upgrade if its read is the only lease held
    (otherwise ``LockError``; ``try_acquire`` returns None). ``auto_renew``,
    ``on_lost``, ``max_hold``, ``prefix``, ``clock``, ``replicas``, ``replica_timeout``
    work as for ``Lock``.
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
        tables = {mode: Holders() for mode in (READ, WRITE)}  # each holder's lease
        cores = {
            mode: SideCore.checked(
                specs[mode],
                auto_renew,
                max_hold,
                on_lost,
                clock,
                mode=mode,
                tables=tables,
            )
            for mode in (READ, WRITE)
        }
        io = served(client, specs[READ])
        self._read = ReadWriteSide(self, cores[READ], io)
        self._write = ReadWriteSide(self, cores[WRITE], io)

    @property
    def read(self) -> ReadWriteSide:
        """The read side: shared leases, as many at once as are asked for while no
        writer holds, nor waits before them."""
        return self._read

    @property
    def write(self) -> ReadWriteSide:
        """The write side: one exclusive lease at a time, while nothing else is held."""
        return self._write

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._read.name

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._read.ttl

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl}s>"
