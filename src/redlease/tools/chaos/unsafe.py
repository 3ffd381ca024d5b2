"""DELIBERATELY WRONG Redlock rules, for the fault harness to show that its checker
catches each one. Never use them outside the harness and tests: each lets two holders in
at once. ``unsafe_redlock(Redlock, Unsafe(flaw=True))`` is a Redlock class that follows them.

``ignore_elapsed``: validity = ttl - drift, as if acquiring took no time;
``half_quorum``: N//2 nodes are taken as a majority;
``release_believed_only``: release only on the nodes that said yes (a SET whose reply
was lost stays behind, and a holder it blocks is not counted against).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from ..._rules.quorum import QuorumRules, Tally

RedlockT = TypeVar("RedlockT", bound=type)


@dataclass(frozen=True)
class Unsafe(QuorumRules):
    ignore_elapsed: bool = False
    half_quorum: bool = False
    release_believed_only: bool = False

    def quorum(self, n: int) -> int:
        return max(1, n // 2) if self.half_quorum else super().quorum(n)

    def validity_start(self, sent_at: float, now: float) -> float:
        return now if self.ignore_elapsed else super().validity_start(sent_at, now)

    def undo_round(self, tally: Tally, n: int) -> list[int]:
        if self.release_believed_only:
            return sorted(tally.counters)
        return super().undo_round(tally, n)

    def release_on(self, believed: frozenset[int]) -> list[int] | None:
        return sorted(believed) if self.release_believed_only else super().release_on(believed)


def unsafe_redlock(redlock: RedlockT, rules: Unsafe) -> RedlockT:
    """A subclass of ``redlock`` (``Redlock`` or ``AsyncRedlock``) that follows ``rules``:
    the public classes take no argument that could make them unsafe."""
    return type(f"Unsafe{redlock.__name__}", (redlock,), {"_rules": rules})  # type: ignore[return-value]
