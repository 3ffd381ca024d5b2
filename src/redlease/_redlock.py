"""``Redlock`` and ``AsyncRedlock``: one lock name over N independent masters, held while
a majority of them agree. Twins: the same arguments and methods in the same order; the
rules (quorum, validity, fencing, retries) live in ``_quorum``, the I/O here.

Fan-out. Both drivers write the command on one connection per node, then read the
replies in turn, each due ``node_timeout`` after its own send, so a round costs about one
round trip whatever N is, with no thread pool and no task per node. Acquire, extend and
release stop reading once a majority said yes; the replies left are read before their
connections' next ones (see ``_spin``). A node that has not answered in time is a "no"
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
holder's majority keeps at least one node with its data (see ``_quorum``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from . import _arguments as args
from . import _flows, _io_async, _io_sync, _quorum
from ._errors import (
    InvalidArgument,
    warn,
)
from ._flows import Call, Command, Grant, LockSpec, Sleep
from ._front_async import AsyncFront
from ._front_sync import SyncFront
from ._fronts import check_served, is_async_client
from ._io_async import _CHECKED as _ASYNC_CHECKED
from ._io_async import AsyncIO
from ._io_sync import _CHECKED as _SYNC_CHECKED
from ._io_sync import SyncIO
from ._keys import DEFAULT_PREFIX
from ._lease import Holders, LeaseState
from ._lease_async import AsyncLeaseBlock
from ._lease_sync import SyncLeaseBlock
from ._quorum import SAFE, Fanout, QuorumAcquisition, QuorumFlow, QuorumGrant, QuorumSpec, Rules
from ._timing import Clock

__all__ = ["AsyncRedlock", "AsyncRedlockLease", "Redlock", "RedlockLease"]

T = TypeVar("T")
Seconds = float | timedelta
OnLost = Callable[[Any], object]

# The one-time eviction-policy check waits at least this long per node (it is only a
# warning, but a node that is merely slow should not skip it).
CHECK_WAIT = 0.05


def _node_identity(client: Any) -> tuple[object, ...]:
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None) or {}
    if "host" in kwargs:
        return (kwargs["host"], kwargs.get("port", 6379), kwargs.get("db", 0))
    if "path" in kwargs:
        return (kwargs["path"], kwargs.get("db", 0))
    return (id(client),)


def _node_name(client: Any) -> str:
    ident = _node_identity(client)
    if len(ident) == 3:
        return f"{ident[0]}:{ident[1]}/{ident[2]}"
    if len(ident) == 2:
        return f"{ident[0]}/{ident[1]}"
    return f"{type(client).__name__}@{id(client):x}"


def _check_nodes(nodes: object, *, want_async: bool) -> list[Any]:
    """The node clients: a non-empty list of distinct clients, all sync or all asyncio."""
    if callable(getattr(nodes, "execute_command", None)):
        raise InvalidArgument(
            "nodes must be a list of clients (one per independent server), not a single "
            "client; use Lock for one server"
        )
    if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Sequence):
        raise InvalidArgument(f"nodes must be a list of clients, not {type(nodes).__name__}")
    clients = list(nodes)
    if not clients:
        raise InvalidArgument("nodes must not be empty: Redlock needs at least one server")
    kinds: dict[bool, int] = {}
    for i, client in enumerate(clients):
        check_served(client, f"nodes[{i}]")
        kinds.setdefault(is_async_client(client), i)
        ident = _node_identity(client)
        for j, other in enumerate(clients[:i]):
            if other is client or _node_identity(other) == ident:
                raise InvalidArgument(
                    f"nodes[{j}] and nodes[{i}] are the same node ({_node_name(client)}): "
                    "Redlock needs distinct, independent servers"
                )
    if len(kinds) > 1:
        raise InvalidArgument(
            f"nodes mixes sync and asyncio clients (nodes[{kinds[False]}] is sync, "
            f"nodes[{kinds[True]}] is asyncio)"
        )
    if want_async not in kinds:
        if want_async:
            raise InvalidArgument(
                "nodes must be asyncio clients (redis.asyncio, valkey.asyncio) for "
                "AsyncRedlock; use Redlock with sync clients"
            )
        raise InvalidArgument(
            "nodes must be sync clients (redis.Redis, valkey.Valkey) for Redlock; use "
            "AsyncRedlock with asyncio clients"
        )
    return clients


# -- drivers ------------------------------------------------------------------------------


class _SyncNodes:
    """Carries quorum flows to N sync clients: write to all, then read all."""

    def __init__(self, clients: Sequence[Any], spec: QuorumSpec) -> None:
        self.ios = [SyncIO(c) for c in clients]
        self.spec = spec
        self._checked = False

    def run(self, flow: QuorumFlow[T], action: str) -> T:
        reply: Any = None
        while True:
            try:
                step = flow.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                reply = None
            else:
                reply = self._carry(step, action)

    def fan_out(
        self, op: Call | Command, nodes: Sequence[int], timeout: float, action: str
    ) -> list[Any]:
        """``op`` on each of ``nodes``: the replies, or the errors that stand for none."""
        return _io_sync.fan_out(self.ios, op, nodes, timeout, action)

    def execute_many(self, fans: Sequence[Fanout]) -> list[Any]:
        """The renewer's seam: the first step of each lease's extend flow, one fan-out
        after another; per fan-out the replies, for the flow to judge."""
        return [self._carry(fan, "renew") for fan in fans]

    def _carry(self, fan: Fanout, action: str) -> list[Any]:
        return _io_sync.fan_out(
            self.ios, fan.call, fan.nodes, fan.timeout, action, fan.enough, fan.yes
        )

    def check_server_once(self) -> None:
        """Warn (once per server) if a node may evict lock keys; never fails."""
        if self._checked:
            return
        self._checked = True
        fresh = [i for i, io in enumerate(self.ios) if _pool_of(io) not in _SYNC_CHECKED]
        for i in fresh:
            _SYNC_CHECKED.add(_pool_of(self.ios[i]))
        if fresh:
            wait = max(self.spec.node_timeout, CHECK_WAIT)
            check = dataclasses.replace(_flows.NODE_SETTINGS, timeout=wait)
            replies = self.fan_out(check, fresh, wait, "check")
            _warn_evicting(self.spec, fresh, replies)


class _AsyncNodes:
    """Carries quorum flows to N asyncio clients: write to all, then read all."""

    def __init__(self, clients: Sequence[Any], spec: QuorumSpec) -> None:
        self.ios = [AsyncIO(c) for c in clients]
        self.spec = spec
        self._checked = False

    async def run(self, flow: QuorumFlow[T], action: str) -> T:
        reply: Any = None
        while True:
            try:
                step = flow.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                reply = None
            else:
                reply = await self._carry(step, action)

    async def fan_out(
        self, op: Call | Command, nodes: Sequence[int], timeout: float, action: str
    ) -> list[Any]:
        """``op`` on each of ``nodes``: the replies, or the errors that stand for none."""
        return await _io_async.fan_out(self.ios, op, nodes, timeout, action)

    async def execute_many(self, fans: Sequence[Fanout]) -> list[Any]:
        """The renewer's seam (see ``_SyncNodes``)."""
        return [await self._carry(fan, "renew") for fan in fans]

    async def _carry(self, fan: Fanout, action: str) -> list[Any]:
        return await _io_async.fan_out(
            self.ios, fan.call, fan.nodes, fan.timeout, action, fan.enough, fan.yes
        )

    async def check_server_once(self) -> None:
        """Warn (once per server) if a node may evict lock keys; never fails."""
        if self._checked:
            return
        self._checked = True
        fresh = [i for i, io in enumerate(self.ios) if _pool_of(io) not in _ASYNC_CHECKED]
        for i in fresh:
            _ASYNC_CHECKED.add(_pool_of(self.ios[i]))
        if fresh:
            wait = max(self.spec.node_timeout, CHECK_WAIT)
            check = dataclasses.replace(_flows.NODE_SETTINGS, timeout=wait)
            replies = await self.fan_out(check, fresh, wait, "check")
            _warn_evicting(self.spec, fresh, replies)


def _pool_of(io: SyncIO | AsyncIO) -> Any:
    """What a server is checked once per: redlease's pool for it, or the client."""
    return io.pool or io.client


def _warn_evicting(spec: QuorumSpec, nodes: Sequence[int], replies: Sequence[Any]) -> None:
    for i, reply in zip(nodes, replies, strict=True):
        if isinstance(reply, BaseException):
            continue  # CONFIG may be renamed or denied, or the node is down: nothing to learn
        message = _flows.settings_warning(reply)
        if message:
            said = f"{spec.nodes[i]}: {message}"
            warn(said, once=said)


# -- leases -------------------------------------------------------------------------------


class _QuorumLease(LeaseState):
    """What both Redlock leases add to a lease, without I/O: the nodes, the ones that
    said yes, and the quorum flows (extend and release count only when a majority
    confirms; release goes to every node)."""

    def __init__(
        self, spec: QuorumSpec, grant: QuorumGrant, nodes: Any, on_lost: OnLost | None = None
    ) -> None:
        super().__init__(spec.lock, grant, on_lost)
        self._quorum = spec
        self._io = nodes  # _SyncNodes or _AsyncNodes
        self._believed = grant.nodes

    def _extend_flow(self, ttl_ms: int, wait: float | None = None) -> Any:
        return _quorum.extend(self._quorum, self._token, ttl_ms, wait)

    def _release_flow(self) -> Any:
        return _quorum.release(self._quorum, self._token, self._believed)


class RedlockLease(_QuorumLease, SyncLeaseBlock):
    """A held Redlock (sync): the same surface as ``Lease``."""


class AsyncRedlockLease(_QuorumLease, AsyncLeaseBlock):
    """A held Redlock (asyncio twin of ``RedlockLease``)."""


# -- the locks ----------------------------------------------------------------------------


# The fewest nodes with a majority that survives one of them failing.
MIN_TOLERANT_NODES = 3


class _RedlockConfig:
    """Arguments shared by the twins, checked once."""

    _refuses_nesting = True  # see _fronts.refuse_nested

    _metric_kind = "redlock"
    # The quorum rules. Only the fault harness's deliberately broken Redlocks (a subclass
    # each: redlease.tools.chaos.unsafe) change them; no argument does.
    _rules: Rules = SAFE

    def __init__(
        self,
        name: object,
        ttl: object,
        names: Sequence[str],
        *,
        auto_renew: object,
        on_lost: object,
        max_hold: object,
        reentrant: object,
        node_timeout: object,
        prefix: object,
        clock: Clock | None,
    ) -> None:
        lock = LockSpec.create(name, ttl, prefix=prefix, clock=clock)
        timeout = args.node_timeout(node_timeout, lock.ttl_ms)
        self._spec = QuorumSpec.create(lock, names, timeout, self._rules)
        if len(names) < MIN_TOLERANT_NODES:
            # Allowed (tests, a first step to more nodes) but worth saying: with one or
            # two nodes, every node must answer, so one node down stops every acquire.
            warn(
                f"Redlock over {len(names)} node(s) tolerates no node failure: use at "
                f"least {MIN_TOLERANT_NODES} independent masters (or Lock for one server)"
            )
        self._auto_renew, self._max_hold = args.renewal(auto_renew, max_hold, clock)
        self._on_lost: OnLost | None = args.callback(on_lost, "on_lost")  # type: ignore[assignment]
        if args.flag(reentrant, "reentrant"):
            self._holding: Holders | None = Holders()

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._spec.lock.name

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._spec.lock.ttl

    @property
    def quorum(self) -> int:
        """How many nodes must agree: N//2 + 1."""
        return self._spec.quorum

    @property
    def node_timeout(self) -> float:
        """Seconds each node's reply is waited for in a round."""
        return self._spec.node_timeout

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} ttl={self.ttl}s "
            f"nodes={len(self._spec.nodes)} quorum={self.quorum}>"
        )


class Redlock(_RedlockConfig, SyncFront[RedlockLease]):
    """A lock held on a majority of independent Redis/Valkey masters (sync).

    ``nodes`` are one sync client per independent server (standalone masters without
    replicas between them). The surface is ``Lock``'s: ``acquire(timeout)``,
    ``try_acquire()``, ``with lock as lease``; the lease has ``fence``, ``token``,
    ``remaining()``, ``extend()``, ``release()``, ``lost`` and ``check()``.

    ``node_timeout`` is how long each node's reply is waited for in a round (default a
    twentieth of the ttl, at most 0.1 s). ``auto_renew``, ``on_lost``, ``max_hold``
    and ``reentrant`` work as for ``Lock``; a renewal counts only when a majority
    confirms it in time.
    A majority that cannot be reached raises ``QuorumError`` naming each failed node;
    plain contention is not an error.
    """

    _io: _SyncNodes

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
        node_timeout: Seconds | None = None,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
    ) -> None:
        clients = _check_nodes(nodes, want_async=False)
        super().__init__(
            name,
            ttl,
            [_node_name(c) for c in clients],
            auto_renew=auto_renew,
            on_lost=on_lost,
            max_hold=max_hold,
            reentrant=reentrant,
            node_timeout=node_timeout,
            prefix=prefix,
            clock=clock,
        )
        self._io = _SyncNodes(clients, self._spec)

    def _new_attempt(self, timeout: float | None, *, wait: bool) -> QuorumAcquisition:
        return QuorumAcquisition(self._spec, timeout, wait=wait)

    def _new_lease(self, grant: Grant) -> RedlockLease:
        assert isinstance(grant, QuorumGrant)
        return RedlockLease(self._spec, grant, self._io, self._on_lost)


class AsyncRedlock(_RedlockConfig, AsyncFront[AsyncRedlockLease]):
    """A lock held on a majority of independent masters (asyncio twin of ``Redlock``).

    ``cancel_on_lost=True`` also cancels the task that acquired a lease when the lease
    is lost, as for ``AsyncLock``.
    """

    _io: _AsyncNodes

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
        cancel_on_lost: bool = False,
        node_timeout: Seconds | None = None,
        prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
    ) -> None:
        clients = _check_nodes(nodes, want_async=True)
        super().__init__(
            name,
            ttl,
            [_node_name(c) for c in clients],
            auto_renew=auto_renew,
            on_lost=on_lost,
            max_hold=max_hold,
            reentrant=reentrant,
            node_timeout=node_timeout,
            prefix=prefix,
            clock=clock,
        )
        self._io = _AsyncNodes(clients, self._spec)
        self._cancel_on_lost = args.flag(cancel_on_lost, "cancel_on_lost")

    def _new_attempt(self, timeout: float | None, *, wait: bool) -> QuorumAcquisition:
        return QuorumAcquisition(self._spec, timeout, wait=wait)

    def _new_lease(self, grant: Grant) -> AsyncRedlockLease:
        assert isinstance(grant, QuorumGrant)
        return AsyncRedlockLease(self._spec, grant, self._io, self._on_lost)
