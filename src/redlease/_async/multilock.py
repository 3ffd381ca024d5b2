"""``AsyncMultiLock`` and ``AsyncMultiLease``: several lock names at once, all or none
(how, and why it never deadlocks: ``_rules.multilock``). Written once, as asyncio code;
``scripts/unasync.py`` generates the blocking twin (``MultiLock``, ``MultiLease``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any

from .._base import metrics as _metrics
from .._base.errors import AcquireTimeout, LockError, LockLost
from .._base.timing import Deadline, valid_until
from .._base.types import Clock, OnLost, Seconds
from .._clients.checks import check_client
from .._rules import arguments as args
from .._rules import flows as _flows
from .._rules.decorate import P, R
from .._rules.flows import Grant, LockSpec, new_token
from .._rules.front import FrontCore
from .._rules.lease import Opening, entered, forget_entered, handlers_run, push_entered
from .._rules.multilock import MultiLeaseState, checked_names, try_all
from .backend import ASYNC, BlockBase, going_away, guarded, shielded
from .front import (
    AsyncFront,
    AsyncLease,
    caller,
    end_block,
    finish_in_haste,
    give_back_in_haste,
    handed_out,
    opened,
    unhanded,
)
from .io import served


class AsyncMultiLease(BlockBase):
    """The leases of a multi-lock, one per name: extend and release all of them."""

    def __init__(self, state: MultiLeaseState) -> None:
        self._state = state
        state.lease = self

    @property
    def leases(self) -> dict[str, AsyncLease]:
        """The lease of each name, in the order the names were given."""
        return self._state.leases

    @property
    def fences(self) -> dict[str, int]:
        """Each name's fencing token."""
        return self._state.fences

    @property
    def lost(self) -> bool:
        """True once any of the leases is lost."""
        return self._state.lost

    @property
    def released(self) -> bool:
        """True once every lease is released."""
        return self._state.released

    def remaining(self) -> float:
        """Seconds of validity left: the least of the leases'."""
        return self._state.remaining()

    def check(self) -> None:
        """Raise LockLost unless every lease is still held and valid."""
        self._state.check()

    def __iter__(self) -> Iterator[AsyncLease]:
        return iter(self._state)

    def __repr__(self) -> str:
        return self._state.described(type(self).__name__)

    async def extend(self, ttl: float | None = None) -> None:
        """Extend every lease (see ``Lease.extend``); LockLost if any is no longer ours."""
        for lease in self._state:
            await lease.extend(ttl)

    async def release(self) -> None:
        """Release every lease, each even if another's release failed; then raise the
        first failure (LockLost if one had been lost). asyncio: cancelling the caller
        does not stop it half-way. Interrupted (an error raised by a signal handler), it
        gives back the leases it had not released yet in haste, as a lease's release
        finishes in haste, before the interruption goes on."""
        try:
            await shielded(self._release_all)  # (a second run: in haste)
        except LockError:
            raise
        except BaseException:
            await finish_in_haste(self._state)
            raise

    async def _release_all(self, hurried: bool) -> None:
        if hurried:
            await finish_in_haste(self._state)
            return
        failures: list[BaseException] = []
        for lease in self._state:
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


class AsyncMultiLock(BlockBase):
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
        specs = [LockSpec.create(n, ttl, prefix=prefix, clock=clock) for n in self._names]
        specs.sort(key=lambda spec: spec.keys.lock)  # the one order every multi-lock takes
        self._specs = specs
        self._io = served(client, specs[0])
        # a lock per name (its metrics say whose it is), over the one driver
        self._locks = [
            AsyncFront(
                FrontCore.checked(
                    spec,
                    auto_renew,
                    max_hold,
                    on_lost,
                    clock,
                    cancel_on_lost=cancel_on_lost,  # unasync: async only
                    kind="multilock",
                ),
                self._io,
            )
            for spec in specs
        ]

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

    async def _acquire(
        self, timeout: float | None, *, wait: bool, entering: Opening | None = None
    ) -> AsyncMultiLease | None:
        """The multi-lease, or None. ``entering``: the `with` block it opens
        (noted before it is returned). Every lease taken is in ``taken`` until the
        multi-lease is returned: an interruption at any step gives them back."""
        deadline = Deadline.after(self._specs[0].clock, timeout)
        taken: list[AsyncLease] = []
        entry = None
        try:
            multi = await self._taken(deadline, taken, wait=wait)
            if multi is not None and entering is not None:
                entry = entered(self, multi._state, entering)
                push_entered(entry)
            return multi
        except BaseException as exc:
            if entry is not None:
                forget_entered(entry)
            hurried = going_away(exc)
            await shielded(functools.partial(self._give_all_back, taken), hurried)
            raise

    async def _taken(
        self, deadline: Deadline, taken: list[AsyncLease], *, wait: bool
    ) -> AsyncMultiLease | None:
        if self._io.direct:  # one server: try them all at once
            if await self._at_once(taken):
                return self._leased(taken)
            if not wait:
                return None
        while True:
            if not await self._in_order(deadline, taken, wait=wait):
                return None
            if not any(lease.lost for lease in taken):
                return self._leased(taken)
            # A name taken first ran out while a later one was waited for: what is
            # held is no longer all of them. Give it back and start over.
            await shielded(functools.partial(self._give_all_back, taken))
            if not wait or deadline.expired():
                return None

    def _leased(self, taken: list[AsyncLease]) -> AsyncMultiLease:
        """The multi-lease of the leases taken (one per name, in the global order)."""
        by_name = {lock.name: lease for lock, lease in zip(self._locks, taken, strict=True)}
        return AsyncMultiLease(MultiLeaseState(self._names, by_name))

    async def _in_order(self, deadline: Deadline, taken: list[AsyncLease], *, wait: bool) -> bool:
        """Each name in the global order, waiting for each (or one try each), into
        ``taken``: True when all are; otherwise False with nothing kept."""
        for lock in self._locks:
            try:
                lease = await (lock.acquire(deadline.left()) if wait else lock.try_acquire())
            except AcquireTimeout:
                lease = None
            if lease is None:
                await shielded(functools.partial(self._give_all_back, taken))
                return False
            taken.append(lease)
        return True

    async def _at_once(self, taken: list[AsyncLease]) -> bool:
        """Every name in one script, into ``taken``: True, or False with nothing kept."""
        await self._io.check_server_once()
        token = new_token()
        started, sent_at = _metrics.now(), self._specs[0].clock()
        made: list[AsyncLease] = []
        try:
            fences = await self._io.run(try_all(self._specs, token), f"acquire {self._names!r}")
            if fences is None:
                return False
            spec = self._specs[0]
            until = valid_until(sent_at, spec.ttl_ms, spec.ttl)
            if until <= spec.clock():  # the reply came too late to be of use: give them back
                await shielded(functools.partial(self._give_back_token, token))
                return False
            for lock, fence in zip(self._locks, fences, strict=True):
                made.append(handed_out(lock, Grant(token, fence, until), started))
        except BaseException as exc:  # (it may have landed; its leases never left here)
            for lease in made:
                unhanded(lease)
            hurried = going_away(exc)
            await shielded(functools.partial(self._give_back_token, token), hurried)
            raise
        taken.extend(made)
        return True

    async def _give_back_token(self, token: str, hurried: bool = False) -> None:
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

    async def _give_all_back(self, leases: list[AsyncLease], hurried: bool = False) -> None:
        """Give back the leases taken one by one, and forget them (what is left expires
        with the ttl); ``hurried``: as for ``_give_back_token``, each lease's renewal
        stopped first. Leases released already are passed over."""
        for lease in leases:
            if lease.released or lease.lost:  # (what was lost is gone from the server)
                continue
            if hurried:
                try:
                    await give_back_in_haste(lease)
                except Exception:
                    break
                continue
            with contextlib.suppress(Exception):
                await lease.release()
        leases.clear()

    async def __aenter__(self) -> AsyncMultiLease:
        # (noted per thread / task, as a lock's `with`)
        leases = await self._acquire(None, wait=True, entering=await opened(caller()))
        assert leases is not None  # (no timeout: the leases, or an error)
        try:  # (as a lock's: see Front.__aenter__)
            handlers_run()
        except BaseException as failure:
            await end_block(self, type(failure), failure, failure.__traceback__)
            raise
        return leases

    __aexit__ = end_block

    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        """``@multi``: each call of ``fn`` runs holding every name, as a lock's
        decorator runs it."""
        return guarded(self, fn)
