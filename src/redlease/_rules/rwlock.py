"""The rules of ``ReadWriteLock`` and ``AsyncReadWriteLock`` (``_async.rwlock`` and its
generated twin) that need no I/O. Many readers or one writer. Each has a
``read`` and a ``write`` side that behave like a ``Lock`` (``acquire``, ``try_acquire``,
``with``), over the shared-hold scripts a ``Semaphore`` runs too (``_rules.scripts``): read
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

from collections.abc import Callable
from typing import Any

from .._base.errors import LockError
from .flows import Acquisition, LockSpec
from .front import FrontCore
from .lease import Holders, LeaseState

READ, WRITE = "r", "w"
# The limit a read lease is granted under: in effect none.
READERS = 1_000_000_000
SIDES = {READ: "read", WRITE: "write"}


class SideCore(FrontCore):
    """The rules of one side of a read/write lock (see the module docstring): its mode's
    spec and table of holds; the other side's table, for a downgrade or an upgrade."""

    def __init__(
        self, spec: LockSpec, *, mode: str, tables: dict[str, Holders], **options: Any
    ) -> None:
        super().__init__(spec, kind="rwlock", mode=SIDES[mode], **options)
        self.side = mode
        self.noun = f"{SIDES[mode]} side of read/write lock"
        self.holding = tables[mode]  # the same mode again: one hold more (_rules.front)
        self._other = tables[WRITE if mode == READ else READ]

    def _other_lease(self, holder: object) -> LeaseState | None:
        """The lease of the other mode ``holder`` holds, if it still does."""
        lease = self._other.held(holder)
        return None if lease is None or lease.lost() else lease

    def new_attempt(
        self, timeout: float | None, *, wait: bool, holder: Callable[[], object]
    ) -> Acquisition:
        other = self._other_lease(holder())
        if other is None:
            return Acquisition(self.spec, timeout, wait=wait)
        # a downgrade, or an upgrade, which is granted at once or not at all (never queued)
        waits = wait and self.side == READ
        return Acquisition(self.spec, timeout, wait=waits, also=(other.token,))

    def refused(self, holder: Callable[[], object], *, wait: bool) -> None:
        """An upgrade the server refused (other readers hold it) raises for ``acquire``;
        ``try_acquire`` returns None."""
        if wait and self.side == WRITE and self._other_lease(holder()):
            raise LockError(
                f"read/write lock {self.name!r}: this holder's read lease is not the only "
                "one held, so it cannot be upgraded to a write lease at once, and waiting "
                "for the other readers could deadlock with one of them upgrading too: "
                "release the read lease first"
            )
