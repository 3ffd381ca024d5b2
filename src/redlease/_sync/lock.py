# Generated from _async/lock.py by scripts/unasync.py: edit that file, then run
# `python scripts/unasync.py` (the tests run it with --check).
"""``Lock``: a lock name on one Redis/Valkey deployment (standalone, Sentinel-managed
or Cluster). Written once, as asyncio code; ``scripts/unasync.py`` generates the blocking
twin (``Lock``). The protocol is in ``_rules.flows``, the lock's rules in
``_rules.front``, the I/O in ``_async.io``, what a caller sees in ``_async.front``.

A lock object holds no ownership state: each acquisition returns its own lease, so one
lock may be shared by many threads (or tasks).
"""

from __future__ import annotations

from typing import Any

from .._base.types import Clock, OnLost, Seconds
from .._clients.checks import check_client
from .._rules.flows import LockSpec
from .._rules.front import FrontCore
from .backend import ASYNC
from .front import Front
from .io import served


class Lock(Front):
    """A distributed lock on one Redis/Valkey deployment.

    ``ttl`` is the lease length; ``fair`` serves waiters in arrival order (no barging);
    ``on_lost(lease)`` is called once if a held lease is found lost.

    ``replicas=n`` makes each grant and extension count only once ``n`` replicas have
    acknowledged it (``WAIT``, at most ``replica_timeout`` seconds, default a tenth of the
    ttl); otherwise the lock is given back and ``BackendError`` raised. It narrows, not
    closes, the window in which a failover to an asynchronous replica loses the lock.

    ``auto_renew`` keeps each lease alive while held: the renewer (the process's one
    thread) extends it well before it runs out and, if it is taken over or cannot be
    renewed in time, marks it lost (``lease.lost``, ``check()`` raises ``LockLost``) and
    calls ``on_lost(lease)`` from that thread no later than the end of its validity:
    keep the callback short. ``max_hold`` (seconds) stops renewal that long after
    acquisition, so a hung holder cannot keep the lock forever. A lease that is never
    released keeps being renewed (until ``max_hold``).

    ``reentrant=True`` lets the holder of a lease (the thread that acquired it) acquire
    the lock again without waiting for itself: ``acquire``, ``try_acquire`` and ``with``
    return the lease it holds, one hold more (``lease.hold_count``); each release takes
    one hold off and the last one releases on the server. If that lease was lost
    meanwhile, acquiring again raises ``LockLost`` (once; the next acquire takes the
    lock anew). A lease handed to another thread still counts as its acquirer's.

    The defaults that are not values: ``on_lost=None`` calls nothing; ``max_hold=None``
    renews for as long as the lease is held; ``clock=None`` is the monotonic clock (tests
    pass a fake one: ``redlease.testing.FakeClock``); ``replica_timeout=None`` is a tenth
    of the ttl. Every key of the lock starts with ``prefix``.

    Raises InvalidArgument, naming the argument, for an argument out of its range or a
    client it cannot serve.
    """

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
        spec = LockSpec.create(
            name,
            ttl,
            fair=fair,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        core = FrontCore.checked(
            spec,
            auto_renew,
            max_hold,
            on_lost,
            clock,
            reentrant=reentrant,
            refuses_nesting=True,  # (see _rules.lease.refuse_nested)
        )
        super().__init__(core, served(client, spec))

    def locked(self) -> bool:
        """Whether anyone holds it now, as the server says. One round trip. A snapshot:
        to act on "free", take it (``try_acquire``), never test first. Raises
        BackendError if the server cannot answer."""
        return (self._look()).held

    def owned(self) -> bool:
        """Whether the caller (the thread) holds a lease of this object that is still
        its own on the server now: one it acquired (lent to others or not), has not
        released, does not know lost, and whose token the server lists as a holder. No
        round trip when it holds none. Raises BackendError if the server cannot answer."""
        return self._owned()

    def waiting(self) -> int:
        """How many waiters are queued and live now (within their deadline, on the
        server's clock); waiters that gave up or died are not counted. Raises
        BackendError if the server cannot answer."""
        return (self._look()).live_waiters
