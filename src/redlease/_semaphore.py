"""``Semaphore`` and ``AsyncSemaphore``: at most ``limit`` holders of a name at once, each
with a permit that is a lease of its own (token, ttl, fence, extend, release, renewal).
Twins over ``Lock``'s core: the same flows, waiting and leases (``_flows``, ``_fronts``,
``_lease``) run the semaphore's scripts (``_scripts``), which keep the holders in a sorted
set by when their permits run out, so a crashed holder's permit expires on its own.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from . import _arguments as args
from ._errors import InvalidArgument
from ._flows import SEMAPHORE, LockSpec
from ._fronts import check_client
from ._keys import DEFAULT_PREFIX
from ._lock import AsyncOneServer, OneServer, OnLost
from ._timing import Clock

Seconds = float | timedelta

# More permits than a semaphore is of use with: each acquire counts its holders.
MAX_LIMIT = 100_000


class _SemaphoreConfig:
    """Arguments shared by the twins, checked once."""

    _noun = "semaphore"
    _metric_kind = "semaphore"

    def __init__(
        self,
        name: object,
        limit: object,
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
        checked = args.count(limit, "limit", MAX_LIMIT)
        if checked < 1:
            raise InvalidArgument("limit must be at least 1, got 0")
        self._limit = checked
        self._spec = LockSpec.create(
            name,
            ttl,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
            kind=SEMAPHORE,
            extra=(str(checked), "r"),
        )
        self._auto_renew, self._max_hold = args.renewal(auto_renew, max_hold, clock)
        self._on_lost: OnLost | None = args.callback(on_lost, "on_lost")  # type: ignore[assignment]

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._spec.name

    @property
    def limit(self) -> int:
        """How many permits this object lets be held at once."""
        return self._limit

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._spec.ttl

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} limit={self.limit} ttl={self.ttl}s>"


class Semaphore(_SemaphoreConfig, OneServer):
    """At most ``limit`` holders of ``name`` at once, on one Redis/Valkey deployment (sync).

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
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
    ) -> None:
        check_client(client, want_async=False, sync_twin="Semaphore")
        super().__init__(
            name,
            limit,
            ttl,
            auto_renew=auto_renew,
            on_lost=on_lost,
            max_hold=max_hold,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        self._serve(client)


class AsyncSemaphore(_SemaphoreConfig, AsyncOneServer):
    """At most ``limit`` holders at once (asyncio twin of ``Semaphore``).

    ``cancel_on_lost=True`` also cancels the task that acquired a permit when the permit
    is lost, as for ``AsyncLock``. A permit granted to a waiter cancelled meanwhile is
    given back.
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
        cancel_on_lost: bool = False,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
    ) -> None:
        check_client(client, want_async=True, sync_twin="Semaphore")
        super().__init__(
            name,
            limit,
            ttl,
            auto_renew=auto_renew,
            on_lost=on_lost,
            max_hold=max_hold,
            prefix=prefix,
            clock=clock,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        self._serve(client)
        self._cancel_on_lost = args.flag(cancel_on_lost, "cancel_on_lost")
