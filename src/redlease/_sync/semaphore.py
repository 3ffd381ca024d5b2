# Generated from _async/semaphore.py by scripts/unasync.py: edit that file, then run
# `python scripts/unasync.py` (the tests run it with --check).
"""``Semaphore``: at most ``limit`` holders of a name at once, each with a permit that
is a lease of its own (token, ttl, fence, extend, release, renewal). Over ``Lock``'s core:
the same flows, waiting and leases (``_rules.flows``, ``_async.front``) run the semaphore's
scripts (``_rules.scripts``), which keep the holders in a sorted set by when their
permits run out, so a crashed holder's permit expires on its own. Written once, as asyncio
code; ``scripts/unasync.py`` generates the blocking twin (``Semaphore``).
"""

from __future__ import annotations

from typing import Any

from .._base.errors import InvalidArgument
from .._base.types import Clock, OnLost, Seconds
from .._clients.checks import check_client
from .._rules import arguments as args
from .._rules.flows import SEMAPHORE, LockSpec
from .._rules.front import FrontCore
from .backend import ASYNC
from .front import Front
from .io import served

# More permits than a semaphore is of use with: each acquire counts its holders.
MAX_LIMIT = 100_000


class Semaphore(Front):
    """At most ``limit`` holders of ``name`` at once, on one Redis/Valkey deployment.

    ``acquire(timeout=)``, ``try_acquire()`` and ``with sem as permit`` work as for
    ``Lock``; each permit is a lease with its own token, ``fence`` (strictly greater than
    every earlier permit's of this name), ``ttl``, ``extend()``, ``release()``, ``lost``
    and ``check()``. A holder that dies leaves its permit to run out after its ttl.
    Waiters are served in arrival order, as many at once as permits come free.

    ``limit`` is checked by each grant against the permits held: a permit is granted only
    while fewer are held than the limit of the object that asked for it (a waiter's
    limit travels in its queue entry). Objects with different limits for one name (a
    change being rolled out) thus never let more than the larger be held, and a lower
    limit revokes no permit: it grants none until enough are released.

    ``auto_renew``, ``on_lost``, ``max_hold``, ``prefix``, ``clock``, ``replicas`` and
    ``replica_timeout`` work as for ``Lock``.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        limit: int,
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
        check_client(client, want_async=ASYNC, sync_twin="Semaphore")
        checked = args.count(limit, "limit", MAX_LIMIT)
        if checked < 1:
            raise InvalidArgument("limit must be at least 1, got 0")
        self._limit = checked
        spec = LockSpec.create(
            name,
            ttl,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
            kind=SEMAPHORE,
            extra=(str(checked), "r"),
        )
        core = FrontCore.checked(
            spec,
            auto_renew,
            max_hold,
            on_lost,
            clock,
            noun="semaphore",
            kind="semaphore",
        )
        super().__init__(core, served(client, spec))

    @property
    def limit(self) -> int:
        """How many permits this object lets be held at once."""
        return self._limit

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} limit={self.limit} ttl={self.ttl}s>"

    def locked(self) -> bool:
        """Whether any permit is held now, as the server says (``Lock.locked``)."""
        return (self._look()).held

    def owned(self) -> bool:
        """Whether the caller holds a permit of this object that is still its own on the
        server now (``Lock.owned``)."""
        return self._owned()

    def waiting(self) -> int:
        """How many waiters for a permit are queued and live now (``Lock.waiting``)."""
        return (self._look()).live_waiters
