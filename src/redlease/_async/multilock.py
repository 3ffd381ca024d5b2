"""``AsyncMultiLock`` and ``AsyncMultiLease``: several lock names at once, all or none
(how, and why it never deadlocks: ``_rules.multilock``). Written once, as asyncio code;
``scripts/unasync.py`` generates the blocking twin (``MultiLock``, ``MultiLease``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any

from .._base import metrics as _metrics
from .._base.errors import AcquireTimeout, LockLost
from .._base.misuse import AsyncOnly  # unasync: async only
from .._base.timing import Clock, Deadline, valid_until
from .._clients.checks import check_client
from .._rules import arguments as args
from .._rules import flows as _flows
from .._rules.flows import Grant, new_token
from .._rules.fronts import P, R, decorate_async, metered_as, pop_entered, push_entered
from .._rules.lock import OnLost, spec_of
from .._rules.multilock import MultiLeaseState, checked_names, try_all
from .backend import ASYNC, Cancelled, shielded
from .front import handed_out
from .lease import AsyncLease, give_back_in_haste
from .lock import AsyncLock, driver_of

Seconds = float | timedelta


class AsyncMultiLease(MultiLeaseState, AsyncOnly):
    """The leases of a multi-lock, one per name: extend and release all of them."""

    async def extend(self, ttl: float | None = None) -> None:
        """Extend every lease (see ``Lease.extend``); LockLost if any is no longer ours."""
        for lease in self._leases.values():
            await lease.extend(ttl)

    async def release(self) -> None:
        """Release every lease, each even if another's release failed; then raise the
        first failure (LockLost if one had been lost). asyncio: cancelling the caller
        does not stop it half-way."""
        await shielded(self._release_all)

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


class AsyncMultiLock(AsyncOnly):
    """Several lock names held together, all or none, on one deployment.

    ``acquire(timeout=None)``, ``try_acquire()`` and ``with mlock as leases`` work as for
    ``Lock``; the ``MultiLease`` has a lease per name (``leases``, ``fences``) and
    ``extend``, ``release``, ``lost``, ``check``, ``remaining``. Never a deadlock between
    multi-locks that share names, in whatever order they list them. The other options
    are ``Lock``'s and apply to each name. asyncio: cancelling an acquire at any point
    leaves none of the names held.
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
        cancel_on_lost: bool = False,  # unasync: async only
        prefix: str = "redlease:",
        clock: Clock | None = None,
    ) -> None:
        check_client(client, want_async=ASYNC, sync_twin="MultiLock")
        self._names = checked_names(names)
        options: dict[str, Any] = {
            "auto_renew": auto_renew,
            "on_lost": on_lost,
            "max_hold": max_hold,
            "cancel_on_lost": cancel_on_lost,  # unasync: async only
            "prefix": prefix,
            "clock": clock,
        }
        locks = {n: AsyncLock(client, n, ttl, **options) for n in self._names}
        for lock in locks.values():
            metered_as(lock, "multilock")  # each name's metrics say whose it is
        # the one global order every multi-lock takes its names in
        self._locks = [
            locks[n] for n in sorted(self._names, key=lambda n: spec_of(locks[n]).keys.lock)
        ]
        self._io = driver_of(self._locks[0])
        self._specs = [spec_of(lock) for lock in self._locks]

    @property
    def names(self) -> list[str]:
        return list(self._names)

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._locks[0].ttl

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._names!r} ttl={self.ttl}s>"

    async def acquire(self, timeout: Seconds | None = None) -> AsyncMultiLease:
        """Wait until every name is ours and return their leases (``timeout`` as for
        ``Lock.acquire``: AcquireTimeout if some name stayed busy; nothing is kept)."""
        lease = await self._acquire(args.timeout(timeout), wait=True)
        if lease is None:
            raise AcquireTimeout(f"locks {self._names!r} still busy after {timeout}s")
        return lease

    async def try_acquire(self) -> AsyncMultiLease | None:
        """Take every name if all are free right now; never waits. None otherwise."""
        return await self._acquire(0.0, wait=False)

    async def _acquire(self, timeout: float | None, *, wait: bool) -> AsyncMultiLease | None:
        deadline = Deadline.after(self._specs[0].clock, timeout)
        if self._io.direct:  # one server: try them all at once
            held = await self._at_once()
            if held is not None or not wait:
                return held
        while True:
            leases = await self._in_order(deadline, wait=wait)
            if leases is None:
                return None
            if not any(lease.lost for lease in leases.values()):
                return AsyncMultiLease(self._names, leases)
            # A name taken first ran out while a later one was waited for: what is
            # held is no longer all of them. Give it back and start over.
            await shielded(functools.partial(self._give_all_back, leases))
            if not wait or deadline.expired():
                return None

    async def _in_order(self, deadline: Deadline, *, wait: bool) -> dict[str, AsyncLease] | None:
        """Each name in the global order, waiting for each (or one try each); all their
        leases, or None with nothing kept."""
        held: dict[str, AsyncLease] = {}
        try:
            for lock in self._locks:
                left = deadline.left()
                lease = await (lock.try_acquire() if not wait else lock._acquire(left, wait=True))
                if lease is None:
                    break
                held[lock.name] = lease
        except BaseException as exc:
            hurried = _going_away(exc)
            await shielded(functools.partial(self._give_all_back, held, hurried=hurried))
            raise
        if len(held) < len(self._locks):
            await shielded(functools.partial(self._give_all_back, held))
            return None
        return held

    async def _at_once(self) -> AsyncMultiLease | None:
        await self._io.check_server_once()
        token = new_token()
        started, sent_at = _metrics.now(), self._specs[0].clock()
        try:
            fences = await self._io.run(try_all(self._specs, token), f"acquire {self._names!r}")
        except BaseException as exc:  # (it may have landed)
            hurried = _going_away(exc)
            await shielded(functools.partial(self._give_back_token, token, hurried=hurried))
            raise
        if fences is None:
            return None
        spec = self._specs[0]
        until = valid_until(sent_at, spec.ttl_ms, spec.ttl)
        if until <= spec.clock():  # the reply came too late to be of use: give them back
            await shielded(functools.partial(self._give_back_token, token))
            return None
        leases = {
            lock.name: handed_out(lock, Grant(token, fence, until), started)
            for lock, fence in zip(self._locks, fences, strict=True)
        }
        return AsyncMultiLease(self._names, leases)

    async def _give_back_token(self, token: str, *, hurried: bool = False) -> None:
        """Release each name held with ``token``, and mark the try given up (the
        first name's leave does: a try still on its way then takes nothing, see
        ``_rules.flows.leave``). ``hurried`` (the process is going away): each release
        bounded, and the first that fails ends the clean-up (the names share one server:
        the others would wait on it too); what is left expires with the ttl."""
        timeout = _flows.PAST_DEADLINE if hurried else None
        for spec in self._specs:
            flow = _flows.leave(spec, token, keep=False, timeout=timeout, patient=not hurried)
            try:
                await self._io.run(flow, "clean up")
            except Exception:
                if hurried:
                    return

    async def _give_all_back(self, leases: dict[str, AsyncLease], *, hurried: bool = False) -> None:
        """Give back the leases taken one by one (what is left expires with the ttl);
        ``hurried``: as for ``_give_back_token``, each lease's renewal stopped first."""
        for lease in leases.values():
            if hurried:
                try:
                    await give_back_in_haste(lease)
                except Exception:
                    return
                continue
            with contextlib.suppress(Exception):
                await lease.release()

    async def __aenter__(self) -> AsyncMultiLease:
        leases = await self.acquire()
        push_entered(self, leases)  # per thread / task, as a lock's `with`
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
        """``@multi``: each call of ``fn`` runs holding every name, as a lock's
        decorator runs it."""
        return decorate_async(self, fn)


def _going_away(exc: BaseException) -> bool:
    """An interruption that ends the process (Ctrl-C, exit, a signal's error: not an
    Exception, nor asyncio's cancellation): its clean-up is made in haste."""
    return not isinstance(exc, (Exception, Cancelled))
