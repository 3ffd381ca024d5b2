"""``AsyncRedlock``: one lock name over N independent masters (a lease's quorum flows and
the options are in ``_rules.redlock``, the rules in ``_rules.quorum``, the nodes' checks in
``_clients.checks``), and its driver over the nodes. Written once, as asyncio code;
``scripts/unasync.py`` generates the blocking twin (``Redlock``, ``RedlockLease``).

Fan-out. The driver writes the command on one connection per node, then reads the
replies in turn, each due ``node_timeout`` after its own send, so a round costs about one
round trip whatever N is, with no thread pool and no task per node. Acquire, extend and
release stop reading once a majority said yes; the replies left are read before their
connections' next ones (see ``_wire.resp``). A node that has not answered in time is a "no"
for that attempt; its connection is dropped, so a late reply cannot be mistaken for a
later command's. A node whose command never left (no connection could be made) cannot
hold the lock and is not sent the release either.

Standalone clients of a known family are talked to on the driver's own connections, so
the client's retry policy (redis-py retries up to 10 times by default) cannot stretch a
round. Other client types (a Cluster client, a custom class) go through their own
methods one node after another, each given up on after ``node_timeout`` (sync: the call
runs on in a thread of its own, its reply unseen): still safe, because ``elapsed`` is
measured around them, but slower and less available.

What Redlock assumes (more in docs/redlock.md): clocks on the nodes and the client run
at about the same rate (1% drift allowed); a holder that pauses past its validity is
protected only by its fencing token; and a node that restarts empty may, until the ttl
has passed, let a second holder in (run the nodes with ``appendfsync always``, or keep
them down for a ttl after a crash). Fencing tokens stay increasing as long as each
holder's majority keeps at least one node with its data (see ``_rules.quorum``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from .._base.errors import warn
from .._base.types import Clock, OnLost, Seconds
from .._clients.checks import check_nodes, node_name
from .._rules import arguments as args
from .._rules import settings as _settings
from .._rules.flows import LockSpec
from .._rules.ops import Call, Command, Sleep
from .._rules.quorum import SAFE, Fanout, QuorumFlow, QuorumRules, QuorumSpec
from .._rules.redlock import MIN_TOLERANT_NODES, QuorumCore
from .backend import ASYNC, sleep
from .front import AsyncFront, AsyncLease
from .io import AsyncIO, fan_out

T = TypeVar("T")


class _AsyncNodes:
    """Carries quorum flows to N clients: write to all, then read all."""

    def __init__(self, clients: Sequence[Any], spec: QuorumSpec) -> None:
        self.ios = [AsyncIO(c) for c in clients]
        self.spec = spec
        self._look = _settings.Look(max(spec.node_timeout, _settings.NODE_WAIT))

    async def run(self, flow: QuorumFlow[T], action: str) -> T:
        reply: Any = None
        while True:
            try:
                step = flow.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if isinstance(step, Sleep):
                await sleep(step.seconds)
                reply = None
            else:
                reply = await self._carry(step, action)

    async def fan_out(
        self, op: Call | Command, nodes: Sequence[int], timeout: float, action: str
    ) -> list[Any]:
        """``op`` on each of ``nodes``: the replies, or the errors that stand for none."""
        return await fan_out(self.ios, op, nodes, timeout, action)

    async def execute_many(self, fans: Sequence[Fanout]) -> list[Any]:
        """The renewer's seam: the first step of each lease's extend flow, one fan-out
        after another; per fan-out the replies, for the flow to judge."""
        return [await self._carry(fan, "renew") for fan in fans]

    async def _carry(self, fan: Fanout, action: str) -> list[Any]:
        return await fan_out(
            self.ios, fan.call, fan.nodes, fan.timeout, action, fan.enough, fan.yes
        )

    async def check_server_once(self, within: float | None = None) -> None:
        """Warn (once per server) if a node may evict lock keys; never fails. It looks
        for ``within`` at most, if given (not at all with no time left)."""
        if self._look.done:
            return
        wait = self._look.due(within)
        if wait is None:
            return
        fresh = [i for i, io in enumerate(self.ios) if _settings.first_look(io.pool, io.client)]
        if fresh:
            replies = await self.fan_out(_settings.node_settings(wait), fresh, wait, "check")
            for i, reply in zip(fresh, replies, strict=True):
                _settings.warn_if_weak(str(self.spec.nodes[i]), reply)


class AsyncRedlockLease(AsyncLease):
    """A held Redlock: the same surface as ``Lease``. Its validity is what the majority's
    grants leave: the lease's time less the time taken to get them and the clocks' drift."""


class AsyncRedlock(AsyncFront):
    """A lock held on a majority of independent Redis/Valkey masters.

    ``nodes`` are one client per independent server (standalone masters without
    replicas between them). The surface is ``Lock``'s: ``acquire(timeout)``,
    ``try_acquire()``, ``with lock as lease``; the lease has ``fence``, ``token``,
    ``remaining()``, ``extend()``, ``release()``, ``lost`` and ``check()``.

    ``node_timeout`` is how long each node's reply is waited for in a round (default a
    twentieth of the ttl, at most 0.1 s). ``auto_renew``, ``on_lost``, ``max_hold``
    and ``reentrant`` (and asyncio's ``cancel_on_lost``) work as for ``Lock``; a renewal
    counts only when a majority confirms it in time.
    A majority that cannot be reached raises ``QuorumError`` naming each failed node;
    plain contention is not an error.
    """

    # The quorum rules. Only the fault harness's deliberately broken Redlocks (a subclass
    # each: redlease.tools.chaos.unsafe) change them; no argument does.
    _rules: QuorumRules = SAFE
    _core: QuorumCore
    _io: _AsyncNodes
    _lease_type = AsyncRedlockLease

    def __init__(
        self,
        nodes: Sequence[Any],
        name: str,
        ttl: Seconds = 10.0,
        *,
        auto_renew: bool = False,
        on_lost: OnLost | None = None,
        max_hold: Seconds | None = None,
        reentrant: bool = False,
        cancel_on_lost: bool = False,  # unasync: async only
        node_timeout: Seconds | None = None,
        prefix: str = "redlease:",
        clock: Clock | None = None,
    ) -> None:
        clients = check_nodes(nodes, want_async=ASYNC)
        names = [node_name(c) for c in clients]
        lock = LockSpec.create(name, ttl, prefix=prefix, clock=clock)
        timeout = args.node_timeout(node_timeout, lock.ttl_ms)
        quorum = QuorumSpec.create(lock, names, timeout, self._rules)
        if len(names) < MIN_TOLERANT_NODES:
            # Allowed (tests, a first step to more nodes) but worth saying: with one or
            # two nodes, every node must answer, so one node down stops every acquire.
            warn(
                f"Redlock over {len(names)} node(s) tolerates no node failure: use at "
                f"least {MIN_TOLERANT_NODES} independent masters (or Lock for one server)"
            )
        core = QuorumCore.checked(
            lock,
            auto_renew,
            max_hold,
            on_lost,
            clock,
            reentrant=reentrant,
            cancel_on_lost=cancel_on_lost,  # unasync: async only
            quorum=quorum,
        )
        super().__init__(core, _AsyncNodes(clients, quorum))

    @property
    def quorum(self) -> int:
        """How many nodes must agree: N//2 + 1."""
        return self._core.quorum.quorum

    @property
    def node_timeout(self) -> float:
        """Seconds each node's reply is waited for in a round."""
        return self._core.quorum.node_timeout

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} ttl={self.ttl}s "
            f"nodes={len(self._core.quorum.nodes)} quorum={self.quorum}>"
        )
