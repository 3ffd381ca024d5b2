"""``MultiLock`` and ``AsyncMultiLock``: several lock names at once, all or none.

Each name is an ordinary lock (``Lock``'s keys, so a ``MultiLock`` over "a" and "b"
excludes a ``Lock`` on "a"). Taking them:

* where all of them live on the one server the client talks to (a standalone or
  Sentinel-managed client: not a Cluster, whose names hash to different slots), one
  script tries them all at once (``MULTI_ACQUIRE``): all free and nobody queued, all
  taken, with one token and a fence each; otherwise none is taken;
* otherwise, and whenever that try fails and the caller waits, the names are taken one
  after the other in one global order (their keys, sorted), each with the lock's own
  fair waiting: two multi-locks sharing names, in whatever order they were given, wait
  for each other in the same order, so they can never deadlock. A failure or a timeout
  part-way gives back what was taken; so does a name whose lease ran out while a later
  one was waited for (the wait starts over: a multi-lease is only ever all valid).

The result is a ``MultiLease``: a lease per name (each renewed, extended and released
as a lock's), with ``fences`` by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any

from . import _arguments as args
from . import _flows, _metrics
from ._backend_async import shielded
from ._errors import AcquireTimeout, InvalidArgument, LockLost
from ._flows import Flow, Grant, LockSpec, as_int, new_token
from ._fronts import P, R, check_client, decorate, decorate_async, pop_entered, push_entered
from ._keys import DEFAULT_PREFIX
from ._lease_async import AsyncLease
from ._lease_sync import Lease
from ._lock import OnLost
from ._lock_async import AsyncLock
from ._lock_sync import Lock
from ._misuse import AsyncOnly
from ._scripts import MULTI_ACQUIRE
from ._timing import Clock, Deadline, valid_until

Seconds = float | timedelta

# More names than one all-or-nothing hold is of use with (each is a lock, and a try
# sends all their keys to one script).
MAX_NAMES = 1000


def _names(value: object) -> list[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidArgument(f"names must be a list of lock names, not {type(value).__name__}")
    names = [args.lock_name(n) for n in value]
    if not names:
        raise InvalidArgument("names must not be empty")
    if len(names) > MAX_NAMES:
        raise InvalidArgument(f"names must be at most {MAX_NAMES}, got {len(names)}")
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise InvalidArgument(f"names must be distinct: {twice!r} given more than once")
    return names


def _try_all(specs: list[LockSpec], token: str) -> Flow[list[int] | None]:
    """All the locks in one script, or none: their fences, or None."""
    spec = specs[0]
    keys = tuple(k for s in specs for k in (s.keys.lock, s.keys.fence, s.keys.queue))
    reply = yield spec.call(MULTI_ACQUIRE, token, str(spec.ttl_ms), keys=keys)
    fences = [as_int(f) for f in reply]
    return fences or None


class MultiLeaseState:
    """What both multi-leases share: a lease per name, in the names' order."""

    _holds = 1  # (what a `with` block notes of what it took; a multi-lease nests not)

    def __init__(self, names: list[str], leases: dict[str, Any]) -> None:
        # (Lease or AsyncLease: typed Any so that each twin calls its own methods)
        self._names = names
        self._leases = leases

    @property
    def leases(self) -> dict[str, Any]:
        """The lease of each name, in the order the names were given."""
        return {n: self._leases[n] for n in self._names}

    @property
    def fences(self) -> dict[str, int]:
        """Each name's fencing token."""
        return {n: self._leases[n].fence for n in self._names}

    @property
    def lost(self) -> bool:
        """True once any of the leases is lost."""
        return any(lease.lost for lease in self._leases.values())

    @property
    def released(self) -> bool:
        return all(lease.released for lease in self._leases.values())

    def remaining(self) -> float:
        """Seconds of validity left: the least of the leases'."""
        return min(float(lease.remaining()) for lease in self._leases.values())

    def check(self) -> None:
        """Raise LockLost unless every lease is still held and valid."""
        for lease in self._leases.values():
            lease.check()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.leases.values())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._names!r} remaining={self.remaining():.3f}s>"


class MultiLease(MultiLeaseState):
    """The leases of a ``MultiLock`` (sync): extend and release all of them."""

    def extend(self, ttl: float | None = None) -> None:
        """Extend every lease (see ``Lease.extend``); LockLost if any is no longer ours."""
        for lease in self._leases.values():
            lease.extend(ttl)

    def release(self) -> None:
        """Release every lease, each even if another's release failed; then raise the
        first failure (LockLost if one had been lost)."""
        failures: list[BaseException] = []
        for lease in self._leases.values():
            try:
                lease.release()
            except Exception as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    def __enter__(self) -> MultiLease:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        try:
            self.release()
        except LockLost:
            if exc is None:
                raise


class AsyncMultiLease(MultiLeaseState, AsyncOnly):
    """The leases of an ``AsyncMultiLock``: the asyncio twin of ``MultiLease``."""

    async def extend(self, ttl: float | None = None) -> None:
        """As ``MultiLease.extend``."""
        for lease in self._leases.values():
            await lease.extend(ttl)

    async def release(self) -> None:
        """As ``MultiLease.release``; cancelling the caller does not stop it half-way."""
        await shielded(self._release_all())

    async def _release_all(self) -> None:
        failures: list[BaseException] = []
        for lease in self._leases.values():
            try:
                await lease.release()
            except Exception as exc:
                failures.append(exc)
        if failures:
            raise failures[0]

    async def __aenter__(self) -> AsyncMultiLease:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        try:
            await self.release()
        except LockLost:
            if exc is None:
                raise


class _MultiConfig:
    """Arguments shared by the twins, checked once."""

    def __init__(self, names: object) -> None:
        self._names = _names(names)

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def _ordered(self, locks: dict[str, Any]) -> list[Any]:
        """The locks in the one global order every multi-lock takes them in."""
        for lock in locks.values():
            lock._metric_kind = "multilock"  # each name's metrics say whose it is
        return [locks[n] for n in sorted(self._names, key=lambda n: locks[n]._spec.keys.lock)]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._names!r} ttl={self.ttl}s>"

    @property
    def ttl(self) -> float:
        raise NotImplementedError


class MultiLock(_MultiConfig):
    """Several lock names held together, all or none, on one deployment (sync).

    ``acquire(timeout=None)``, ``try_acquire()`` and ``with mlock as leases`` work as for
    ``Lock``; the ``MultiLease`` has a lease per name (``leases``, ``fences``) and
    ``extend``, ``release``, ``lost``, ``check``, ``remaining``. Never a deadlock between
    multi-locks that share names, in whatever order they list them. The other options
    are ``Lock``'s and apply to each name.
    """

    def __init__(
        self,
        client: Any,
        names: Sequence[str],
        ttl: Seconds = 10.0,
        *,
        auto_renew: bool = False,
        on_lost: OnLost | None = None,
        max_hold: Seconds | None = None,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
    ) -> None:
        check_client(client, want_async=False, sync_twin="MultiLock")
        super().__init__(names)
        options: dict[str, Any] = {
            "auto_renew": auto_renew,
            "on_lost": on_lost,
            "max_hold": max_hold,
            "prefix": prefix,
            "clock": clock,
        }
        locks = {n: Lock(client, n, ttl, **options) for n in self._names}
        self._locks: list[Lock] = self._ordered(locks)
        self._io = self._locks[0]._io
        self._specs = [lock._spec for lock in self._locks]

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._locks[0].ttl

    def acquire(self, timeout: Seconds | None = None) -> MultiLease:
        """Wait until every name is ours and return their leases (``timeout`` as for
        ``Lock.acquire``: AcquireTimeout if some name stayed busy; nothing is kept)."""
        lease = self._acquire(args.timeout(timeout), wait=True)
        if lease is None:
            raise AcquireTimeout(f"locks {self._names!r} still busy after {timeout}s")
        return lease

    def try_acquire(self) -> MultiLease | None:
        """Take every name if all are free right now; never waits. None otherwise."""
        return self._acquire(0.0, wait=False)

    def _acquire(self, timeout: float | None, *, wait: bool) -> MultiLease | None:
        deadline = Deadline.after(self._specs[0].clock, timeout)
        if self._io.direct:  # one server: try them all at once
            held = self._at_once()
            if held is not None or not wait:
                return held
        while True:
            leases = self._in_order(deadline, wait=wait)
            if leases is None:
                return None
            if not any(lease.lost for lease in leases.values()):
                return MultiLease(self._names, leases)
            # A name taken first ran out while a later one was waited for: what is
            # held is no longer all of them. Give it back and start over.
            _give_back_now(leases)
            if not wait or deadline.expired():
                return None

    def _in_order(self, deadline: Deadline, *, wait: bool) -> dict[str, Lease] | None:
        """Each name in the global order, waiting for each (or one try each); all their
        leases, or None with nothing kept."""
        held: dict[str, Lease] = {}
        try:
            for lock in self._locks:
                left = deadline.left()
                lease = lock.try_acquire() if not wait else lock._acquire(left, wait=True)
                if lease is None:
                    break
                held[lock.name] = lease
        except BaseException:
            _give_back_now(held)
            raise
        if len(held) < len(self._locks):
            _give_back_now(held)
            return None
        return held

    def _at_once(self) -> MultiLease | None:
        self._io.check_server_once()
        token = new_token()
        started, sent_at = _metrics.now(), self._specs[0].clock()
        try:
            fences = self._io.run(_try_all(self._specs, token), f"acquire {self._names!r}")
        except BaseException:
            for lock in self._locks:  # it may have landed: give each back
                with contextlib.suppress(Exception):
                    self._io.run(_flows.release(lock._spec, token), "clean up")
            raise
        if fences is None:
            return None
        spec = self._specs[0]
        until = valid_until(sent_at, spec.ttl_ms, spec.ttl)
        if until <= spec.clock():  # the reply came too late to be of use: give them back
            for lock in self._locks:
                with contextlib.suppress(Exception):
                    self._io.run(_flows.release(lock._spec, token), "give back")
            return None
        leases = {
            lock.name: lock._watched(Grant(token, fence, until), started)
            for lock, fence in zip(self._locks, fences, strict=True)
        }
        return MultiLease(self._names, leases)

    def __enter__(self) -> MultiLease:
        leases = self.acquire()
        push_entered(self, leases)  # per thread / task, as a lock's `with`
        return leases

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        leases = pop_entered(self)
        assert isinstance(leases, MultiLease)
        leases.__exit__(exc_type, exc, tb)

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """``@multi``: each call of ``fn`` runs under ``with multi`` (as ``Lock``'s)."""
        return decorate(self, fn)


class AsyncMultiLock(_MultiConfig, AsyncOnly):
    """Several lock names held together, all or none (asyncio twin of ``MultiLock``).
    Cancelling an acquire at any point leaves none of the names held."""

    def __init__(
        self,
        client: Any,
        names: Sequence[str],
        ttl: Seconds = 10.0,
        *,
        auto_renew: bool = False,
        on_lost: OnLost | None = None,
        max_hold: Seconds | None = None,
        cancel_on_lost: bool = False,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
    ) -> None:
        check_client(client, want_async=True, sync_twin="MultiLock")
        super().__init__(names)
        options: dict[str, Any] = {
            "auto_renew": auto_renew,
            "on_lost": on_lost,
            "max_hold": max_hold,
            "cancel_on_lost": cancel_on_lost,
            "prefix": prefix,
            "clock": clock,
        }
        locks = {n: AsyncLock(client, n, ttl, **options) for n in self._names}
        self._locks: list[AsyncLock] = self._ordered(locks)
        self._io = self._locks[0]._io
        self._specs = [lock._spec for lock in self._locks]

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._locks[0].ttl

    async def acquire(self, timeout: Seconds | None = None) -> AsyncMultiLease:
        """As ``MultiLock.acquire``."""
        lease = await self._acquire(args.timeout(timeout), wait=True)
        if lease is None:
            raise AcquireTimeout(f"locks {self._names!r} still busy after {timeout}s")
        return lease

    async def try_acquire(self) -> AsyncMultiLease | None:
        """As ``MultiLock.try_acquire``."""
        return await self._acquire(0.0, wait=False)

    async def _acquire(self, timeout: float | None, *, wait: bool) -> AsyncMultiLease | None:
        deadline = Deadline.after(self._specs[0].clock, timeout)
        if self._io.direct:
            held = await self._at_once()
            if held is not None or not wait:
                return held
        while True:
            leases = await self._in_order(deadline, wait=wait)
            if leases is None:
                return None
            if not any(lease.lost for lease in leases.values()):
                return AsyncMultiLease(self._names, leases)
            await shielded(_give_all_back(leases))  # (see MultiLock._acquire)
            if not wait or deadline.expired():
                return None

    async def _in_order(self, deadline: Deadline, *, wait: bool) -> dict[str, AsyncLease] | None:
        """As ``MultiLock._in_order``."""
        held: dict[str, AsyncLease] = {}
        try:
            for lock in self._locks:
                left = deadline.left()
                lease = await (lock.try_acquire() if not wait else lock._acquire(left, wait=True))
                if lease is None:
                    break
                held[lock.name] = lease
        except BaseException:
            await shielded(_give_all_back(held))
            raise
        if len(held) < len(self._locks):
            await shielded(_give_all_back(held))
            return None
        return held

    async def _at_once(self) -> AsyncMultiLease | None:
        await self._io.check_server_once()
        token = new_token()
        started, sent_at = _metrics.now(), self._specs[0].clock()
        try:
            fences = await self._io.run(_try_all(self._specs, token), f"acquire {self._names!r}")
        except BaseException:
            await shielded(self._give_back_token(token))
            raise
        if fences is None:
            return None
        spec = self._specs[0]
        until = valid_until(sent_at, spec.ttl_ms, spec.ttl)
        if until <= spec.clock():  # (see MultiLock._at_once)
            await shielded(self._give_back_token(token))
            return None
        leases = {
            lock.name: lock._watched(Grant(token, fence, until), started)
            for lock, fence in zip(self._locks, fences, strict=True)
        }
        return AsyncMultiLease(self._names, leases)

    async def _give_back_token(self, token: str) -> None:
        for lock in self._locks:
            with contextlib.suppress(Exception):
                await self._io.run(_flows.release(lock._spec, token), "clean up")

    async def __aenter__(self) -> AsyncMultiLease:
        leases = await self.acquire()
        push_entered(self, leases)
        return leases

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        leases = pop_entered(self)
        assert isinstance(leases, AsyncMultiLease)
        await leases.__aexit__(exc_type, exc, tb)

    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        """``@multi``: each call of the ``async def`` ``fn`` is awaited under ``async
        with multi`` (as ``AsyncLock``'s)."""
        return decorate_async(self, fn)


def _give_back_now(leases: dict[str, Lease]) -> None:
    for lease in leases.values():
        with contextlib.suppress(Exception):  # what is left expires with its ttl
            lease.release()


async def _give_all_back(leases: dict[str, AsyncLease]) -> None:
    for lease in leases.values():
        with contextlib.suppress(Exception):
            await lease.release()
