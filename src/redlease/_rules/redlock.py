"""What ``Redlock`` and ``AsyncRedlock`` (``_async.redlock`` and its generated twin) share
without I/O: one lock name over N independent masters, held while a majority of them
agree. The quorum rules (validity, fencing, retries) live in ``_rules.quorum``, the nodes'
checks and names in ``_clients.checks``, the look at their settings in
``_rules.settings``; here, a Redlock lease's flows and options.

How a round goes, and what Redlock assumes: ``_async.redlock``'s docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._base.types import OnLost
from . import quorum as _quorum
from .flows import Grant, LockSpec
from .front import FrontCore
from .lease import LeaseState
from .quorum import QuorumAcquisition, QuorumGrant, QuorumSpec

# -- leases -------------------------------------------------------------------------------


class QuorumLeaseState(LeaseState):
    """A Redlock lease's rules (see ``_rules.lease.LeaseState``): the nodes that said
    yes, and the quorum flows (extend and release count only when a majority confirms;
    release goes to every node)."""

    def __init__(self, spec: QuorumSpec, grant: QuorumGrant, on_lost: OnLost | None) -> None:
        super().__init__(spec.lock, grant, on_lost)
        self.quorum = spec
        self.believed = grant.nodes

    def extend_flow(self, ttl_ms: int, wait: float | None = None) -> Any:
        return _quorum.extend(self.quorum, self.token, ttl_ms, wait)

    def release_flow(self, *, hurried: bool = False) -> Any:
        # (each node's release is bounded by its node timeout, hurried or not)
        return _quorum.release(self.quorum, self.token, self.believed)


# The fewest nodes with a majority that survives one of them failing.
MIN_TOLERANT_NODES = 3


class QuorumCore(FrontCore):
    """A Redlock's rules (see ``_rules.front.FrontCore``): its quorum spec, whose
    ``lock`` is the spec its name and ttl come from, and the quorum attempt."""

    def __init__(self, spec: LockSpec, *, quorum: QuorumSpec, **options: Any) -> None:
        super().__init__(spec, kind="redlock", refuses_nesting=True, **options)
        self.quorum = quorum

    def new_attempt(
        self, timeout: float | None, *, wait: bool, holder: Callable[[], object]
    ) -> QuorumAcquisition:
        return QuorumAcquisition(self.quorum, timeout, wait=wait)

    def new_state(self, grant: Grant) -> QuorumLeaseState:
        assert isinstance(grant, QuorumGrant)
        return QuorumLeaseState(self.quorum, grant, self.on_lost)
