# Generated from _async/lock.py by scripts/unasync.py: edit that file, then run
# `python scripts/unasync.py` (the tests run it with --check).
"""``Lock``: a lock name on one Redis/Valkey deployment (standalone, Sentinel-managed
or Cluster), and ``OneServer``, what it shares with the semaphore and the read/write
lock's sides. Written once, as asyncio code; ``scripts/unasync.py`` generates the
blocking twin (``Lock``, ``OneServer``). The rules are in ``_rules.flows``, the I/O in
``_async.io``, what a caller sees in ``_async.front``.

A lock object holds no ownership state: each acquisition returns its own lease, so one
lock may be shared by many threads (or tasks).
"""

from __future__ import annotations

from typing import Any

from .._base.types import Clock, OnLost, Seconds
from .._clients.checks import check_client
from .._rules import arguments as args
from .._rules.flows import Acquisition, Grant, LockSpec
from .._rules.lease import Holders
from .._rules.lock import OneName, check_replicas
from .backend import ASYNC, current_holder
from .front import SyncFront
from .io import SyncIO
from .lease import Lease


class OneServer(OneName, SyncFront[Lease]):
    """What ``Lock``, ``Semaphore`` and a read/write lock's sides share: one
    deployment, the one-server flows, and ``locked``, ``owned`` and ``waiting``."""

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
        self._acquirers().note(current_holder(), lease)
        return lease

    def locked(self) -> bool:
        """Whether anyone holds it now, as the server says (a semaphore: any permit; a
        read/write lock's side: any lease, read or write). One round trip. A snapshot:
        to act on "free", take it (``try_acquire``), never test first. Raises
        BackendError if the server cannot answer."""
        return (self._io.run(self._look(), f"inspect {self.name!r}")).held

    def owned(self) -> bool:
        """Whether the caller (the thread; asyncio: the task) holds a lease of this object
        that is still its own on the server now: one it acquired (lent to others or not),
        has not released, does not know lost, and whose token the server lists as a
        holder. No round trip when it holds none. Raises BackendError if the server
        cannot answer."""
        tokens = self._acquirers().tokens(current_holder())
        if not tokens:
            return False
        info = self._io.run(self._look(), f"inspect {self.name!r}")
        return any(holder.token in tokens for holder in info.holders)

    def waiting(self) -> int:
        """How many waiters are queued and live now (within their deadline, on the
        server's clock); waiters that gave up or died are not counted. Raises
        BackendError if the server cannot answer."""
        return (self._io.run(self._look(), f"inspect {self.name!r}")).live_waiters


def driver_of(lock: OneServer) -> SyncIO:
    """The driver that runs ``lock``'s flows (a multi-lock runs its own through it)."""
    return lock._io


class Lock(OneServer):
    """A distributed lock on one Redis/Valkey deployment.

    ``ttl`` is the lease length; ``fair`` serves waiters in arrival order (no barging);
    ``on_lost(lease)`` is called once if a held lease is found lost.

    ``replicas=n`` makes each grant and extension count only once ``n`` replicas have
    acknowledged it (``WAIT``, at most ``replica_timeout`` seconds, default a tenth of the
    ttl); otherwise the lock is given back and ``BackendError`` raised. It narrows, not
    closes, the window in which a failover to an asynchronous replica loses the lock.

    ``auto_renew`` keeps each lease alive while held: the renewer (the process's one
    thread; asyncio: the running event loop's one task) extends it well before it runs
    out and, if it is taken over or cannot be renewed in time, marks it lost
    (``lease.lost``, ``check()`` raises ``LockLost``) and calls ``on_lost(lease)`` from
    that thread (asyncio: in that loop; keep the callback short) no later than the end of
    its validity. ``max_hold`` (seconds) stops renewal that long after acquisition, so a
    hung holder cannot keep the lock forever. A lease that is never released keeps being
    renewed (until ``max_hold``).

    ``reentrant=True`` lets the holder of a lease (the thread that acquired it; asyncio:
    the task) acquire the lock again without waiting for itself: ``acquire``,
    ``try_acquire`` and ``with`` return the lease it holds, one hold more
    (``lease.hold_count``); each release takes one hold off and the last one releases on
    the server. If that lease was lost meanwhile, acquiring again raises ``LockLost``
    (once; the next acquire takes the lock anew). A lease handed to another thread
    still counts as its acquirer's.

    asyncio only: ``cancel_on_lost=True`` also cancels the task that acquired the lease
    when the lease is lost (unless that task is the one that found out, through
    ``extend``, ``release`` or ``lost``), so protected work stops at its next ``await``;
    without ``auto_renew`` it still fires when validity runs out.

    The defaults that are not values: ``on_lost=None`` calls nothing; ``max_hold=None``
    renews for as long as the lease is held; ``clock=None`` is the monotonic clock (tests
    pass a fake one: ``redlease.testing.FakeClock``); ``replica_timeout=None`` is a tenth
    of the ttl. Every key of the lock starts with ``prefix``.

    Raises InvalidArgument, naming the argument, for an argument out of its range or a
    client it cannot serve.
    """

    _refuses_nesting = True  # see _rules.fronts.refuse_nested

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
        prefix: str = "redlease:",
        clock: Clock | None = None,
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
    ) -> None:
        check_client(client, want_async=ASYNC)
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
        self._on_lost = args.callback(on_lost, "on_lost")  # type: ignore[assignment]
        if args.flag(reentrant, "reentrant"):
            self._holding = Holders()
        self._serve(client)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl}s>"
