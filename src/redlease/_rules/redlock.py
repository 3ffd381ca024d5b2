"""What ``Redlock`` and ``AsyncRedlock`` (``_async.redlock`` and its generated twin) share
without I/O: one lock name over N independent masters, held while a majority of them
agree. The quorum rules (validity, fencing, retries) live in ``_rules.quorum``, the nodes'
checks and names in ``_clients.checks``; here, the eviction warning, a Redlock lease's
flows and options.

How a round goes, and what Redlock assumes: ``_async.redlock``'s docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._base.errors import warn
from .._base.types import OnLost
from . import flows as _flows
from . import quorum as _quorum
from .lease import LeaseState
from .quorum import SAFE, QuorumGrant, QuorumSpec, Rules

# The one-time eviction-policy check waits at least this long per node (it is only a
# warning, but a node that is merely slow should not skip it).
CHECK_WAIT = 0.05


def pool_of(io: Any) -> Any:
    """What a server is checked once per: redlease's pool for it, or the client."""
    return io.pool or io.client


def warn_evicting(spec: QuorumSpec, nodes: Sequence[int], replies: Sequence[Any]) -> None:
    for i, reply in zip(nodes, replies, strict=True):
        if isinstance(reply, BaseException):
            continue  # CONFIG may be renamed or denied, or the node is down: nothing to learn
        message = _flows.settings_warning(reply)
        if message:
            said = f"{spec.nodes[i]}: {message}"
            warn(said, once=said)


# -- leases -------------------------------------------------------------------------------


class QuorumLease(LeaseState):
    """What both Redlock leases add to a lease, without I/O: the nodes, the ones that
    said yes, and the quorum flows (extend and release count only when a majority
    confirms; release goes to every node)."""

    def __init__(
        self, spec: QuorumSpec, grant: QuorumGrant, nodes: Any, on_lost: OnLost | None = None
    ) -> None:
        super().__init__(spec.lock, grant, on_lost)
        self._quorum = spec
        self._io = nodes  # a Redlock's nodes (the driver)
        self._believed = grant.nodes

    def _extend_flow(self, ttl_ms: int, wait: float | None = None) -> Any:
        return _quorum.extend(self._quorum, self._token, ttl_ms, wait)

    def _release_flow(self, *, hurried: bool = False) -> Any:
        # (each node's release is bounded by its node timeout, hurried or not)
        return _quorum.release(self._quorum, self._token, self._believed)


# The fewest nodes with a majority that survives one of them failing.
MIN_TOLERANT_NODES = 3


class RedlockRules:
    """What a Redlock says of itself: its name, ttl, quorum and node timeout."""

    _refuses_nesting = True  # see _rules.fronts.refuse_nested
    _metric_kind = "redlock"
    # The quorum rules. Only the fault harness's deliberately broken Redlocks (a subclass
    # each: redlease.tools.chaos.unsafe) change them; no argument does.
    _rules: Rules = SAFE
    _spec: QuorumSpec

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
