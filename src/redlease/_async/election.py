"""``AsyncElection``: candidates wait for a lock kept under the election's keys, and
observers are rung when the leader changes (the rules are in ``_rules.election``). Written once,
as asyncio code; ``scripts/unasync.py`` generates the blocking twin (``Election``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from .._base.errors import BackendError, LockLost
from .._base.types import OnLost, Seconds
from .._clients.checks import check_client
from .._rules import arguments as args
from .._rules.election import (
    Leader,
    announce_change,
    default_identity,
    look,
    observers_of,
    read_leader,
    retry_after,
    rung,
)
from .._rules.flows import ELECTION, LockSpec, new_token
from .._rules.front import FrontCore
from .._rules.ops import Mailbox
from .backend import ASYNC, BlockBase, Flag, going_away, shielded
from .front import AsyncFront, AsyncLease, give_back_in_haste
from .io import AsyncIO, served

log = logging.getLogger(__name__)


class _AsyncCandidacy(AsyncFront):
    """The lock a candidate waits for (always renewed)."""


class AsyncElection:
    """Leader election on one Redis/Valkey deployment.

    ``campaign(timeout=None)`` waits until this candidate leads and returns its
    leadership lease: renewed automatically while held, ``fence`` is the term (strictly
    increasing across leaders), ``lost``/``check()``/``on_lost`` tell the leader when it
    no longer leads, before a successor can be elected. ``resign()`` hands leadership
    to the next candidate at once. ``leader()`` says who leads now (``Leader(identity,
    term)``) or None; ``observe()`` yields the leader after each change, woken by the
    server. ``identity`` defaults to "hostname:pid". asyncio only: ``cancel_on_lost=True``
    also cancels the task that won the campaign when its leadership is lost, as it does
    for asyncio locks.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        ttl: Seconds = 10.0,
        *,
        identity: str | None = None,
        on_lost: OnLost | None = None,
        cancel_on_lost: bool = False,  # unasync: async only
        prefix: str = "redlease:",
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
    ) -> None:
        check_client(client, want_async=ASYNC, sync_twin="Election")
        who = default_identity() if identity is None else args.identity(identity)
        self._identity = who
        self._spec = LockSpec.create(
            name,
            ttl,
            prefix=prefix,
            replicas=replicas,
            replica_timeout=replica_timeout,
            kind=ELECTION,
            token_tail=who.encode().hex(),
        )
        core = FrontCore(
            self._spec,
            auto_renew=True,
            on_lost=args.callback(on_lost, "on_lost"),  # type: ignore[arg-type]
            cancel_on_lost=args.flag(cancel_on_lost, "cancel_on_lost"),  # unasync: async only
            noun="election",
            kind="election",
        )
        self._observers = observers_of(self._spec)
        self._io = served(client, self._spec)
        self._candidacy = _AsyncCandidacy(core, self._io)
        self._lease: AsyncLease | None = None

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._spec.name

    @property
    def ttl(self) -> float:
        """The leadership lease's length, in seconds."""
        return self._spec.ttl

    @property
    def identity(self) -> str:
        """This candidate's identity, as ``leader()`` reports it."""
        return self._identity

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} identity={self.identity!r}>"

    async def campaign(self, timeout: Seconds | None = None) -> AsyncLease:
        """Wait until this candidate leads (``timeout``: as ``Lock.acquire``'s, raising
        ``AcquireTimeout``) and return the leadership lease. Campaigning while leading
        returns the lease held. A candidate interrupted while it waits (asyncio:
        cancelled) leaves the queue, and gives back a leadership granted meanwhile."""
        held = self._lease
        if held is not None and not (held.lost or held.released):
            return held
        lease = await self._candidacy.acquire(timeout)
        self._lease = lease
        try:
            await self._tell("elected")
        except BaseException as exc:  # interrupted before the caller had the lease
            # hand it on, and say so; in haste if the process is going away (see
            # _rules.flows.release)
            await shielded(self._give_up, going_away(exc))
            raise
        return lease

    async def _give_up(self, hurried: bool) -> None:
        await (self._resign_in_haste() if hurried else self.resign())

    async def _resign_in_haste(self) -> None:
        """Give leadership back within half a second, no retry, no announcement:
        what a server that does not answer keeps expires with the ttl (and observers
        see the change when they next look). Forgotten once given back: a run cut
        short is run again (see ``shielded``)."""
        lease = self._lease
        if lease is not None:
            with contextlib.suppress(Exception):
                await give_back_in_haste(lease)
            self._lease = None

    async def resign(self) -> None:
        """Stop leading (if this candidate leads): the next candidate leads at once."""
        lease, self._lease = self._lease, None
        if lease is None:
            return
        with contextlib.suppress(LockLost):  # it had been lost: nothing to hand over
            await lease.release()
        await self._tell("resigned")

    async def leader(self) -> Leader | None:
        """Who leads now and since which term; None if nobody does."""
        flow = read_leader(self._spec, self._observers)
        leader, _ = await self._io.run(flow, f"read the leader of {self.name!r}")
        return leader

    def observe(self) -> AsyncObservation:
        """The leader now, then after each change (None while nobody leads), to iterate
        (asyncio: with an asynchronous for loop) until the observation is closed.
        Woken by the server when a leader is elected or resigns, and when a leader's
        lease runs out; a consumer slower than the changes sees the latest. A server
        that is unreachable for a while (restarting, failing over) is waited for; any
        other failure is raised."""
        return AsyncObservation(self._io, self._spec, self._observers)

    async def _tell(self, what: str) -> None:
        try:
            flow = announce_change(self._spec, self._observers)
            await self._io.run(flow, f"announce {self.name!r}")
        except BackendError as failure:  # observers still see it, when they next look
            log.warning(
                "election %r: %s, but observers were not told: %s", self.name, what, failure
            )


class AsyncObservation(BlockBase):
    """What ``observe()`` returns: iterate it for the leader after each change.
    ``close()`` (from any thread; asyncio: from its loop, as ``aclose`` is), or leaving
    its ``with`` block, ends the iteration: at once while it waits through the process's
    hub, else within a ttl. asyncio: cancelling the task that iterates ends it too."""

    def __init__(self, io: AsyncIO, spec: LockSpec, observers: str) -> None:
        self._io, self._spec, self._observers = io, spec, observers
        self._token = new_token()
        self._box: Mailbox | None = None
        self._last: Any = AsyncObservation  # (no leader seen yet: not even None)
        self._failures = 0
        self._closed = Flag()

    def __aiter__(self) -> AsyncObservation:
        return self

    async def __anext__(self) -> Leader | None:
        spec, action = self._spec, f"observe {self._spec.name!r}"
        while not self._closed.is_set():
            try:
                leader, wait, self._box = await self._io.run(
                    look(spec, self._observers, self._token, self._box), action
                )
            except BackendError as failure:
                self._failures += 1
                await self._closed.wait(retry_after(failure, self._failures))
                continue
            self._failures = 0
            if leader != self._last:
                self._last = leader
                return leader
            if not self._closed.is_set():
                await self._io.run(rung(spec, self._token, self._box, wait), action)
        raise StopAsyncIteration

    def close(self) -> None:
        """Stop observing (the registration on the server runs out by itself)."""
        self._closed.set()
        box = self._box
        if box is not None:
            box.put(None)  # wakes a wait in progress

    # unasync: async only
    async def aclose(self) -> None:
        """Stop observing, as ``close()``."""
        self.close()

    # unasync: end

    async def __aenter__(self) -> AsyncObservation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
