"""The checker: turns the workers' records and the resource's state into violations.

- lost updates (unfenced): sections that completed believing they held the lock, minus
  the final unfenced counter;
- overlaps: pairs of believed-held intervals from different workers that intersect
  (``time.monotonic()`` is one system-wide clock on Linux); ``overlaps_unpaused`` counts
  those where neither section was one the harness paused, which only a lock that frees
  someone else's lease (a wrong release) produces;
- fenced: lost updates (accepted writes minus the final fenced counter), stale writes the
  resource accepted, accepted tokens that went down, grants whose token did not increase
  over a grant known to have come before them (see ``grant_regressions``);
- keys without TTL on the lock servers (fence counters excluded: they are meant to stay);
- keys left behind: nodes still holding a token just released (when the plan audits);
- lost-lease notifications and their lead time (end of validity minus notification).
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

from .resource import ResourceState


@dataclass(frozen=True)
class Section:
    worker: int
    start: float
    end: float
    fence: int | None
    latency: float
    outcome: str  # "accepted", "rejected", "none" (no fence), "lost" (told in time, no
    # write), "read" (a read lease: wrote nothing)
    paused: bool
    mode: str = "x"  # exclusive; "r" a read lease; "s" a semaphore's permit


@dataclass
class Record:
    plan: Any
    workers: list[dict[str, Any]]
    resource: ResourceState
    keys_without_ttl: list[str]
    start: float
    heals: list[float] = field(default_factory=list)
    gates: dict[str, int] = field(default_factory=dict)  # rows 20: each gated counter's end
    fault_windows: list[tuple[float, float, str]] = field(default_factory=list)
    nemesis_log: list[tuple[float, str]] = field(default_factory=list)

    @property
    def sections(self) -> list[Section]:
        return [Section(*s) for w in self.workers for s in w.get("sections", [])]


@dataclass
class Outcome:
    record: Record
    completed: int
    lost_updates: int
    overlaps: list[tuple[Section, Section]]
    overlaps_unpaused: int
    fenced_lost_updates: int
    stale_accepted: int
    rejected: int
    token_regressions: int
    grant_regressions: int
    keys_without_ttl: list[str]
    leftovers: int
    acquisitions_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    recovery_s: float | None
    notifications: int
    min_lead_ms: float | None
    timeouts: int
    errors: int
    crashed_workers: int
    max_gap_s: float  # the longest the lock stood idle between two sections
    excess: int = 0  # moments more permits were held than a semaphore's limit
    # rows 20, per gate ("sql", "redis"): writes accepted, sections stopped at the gate,
    # and updates lost (writes accepted beyond the counter's final value)
    gates: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def fenced(self) -> bool:
        return any(s.fence is not None for s in self.record.sections)

    @property
    def unfenced_violations(self) -> int:
        return (
            max(0, self.lost_updates)
            + len(self.overlaps)
            + self.excess
            + len(self.keys_without_ttl)
            + self.leftovers
        )

    @property
    def fenced_violations(self) -> int:
        return (
            max(0, self.fenced_lost_updates)
            + self.stale_accepted
            + self.token_regressions
            + self.grant_regressions
            + len(self.keys_without_ttl)
            + self.leftovers
            + (1 if self.min_lead_ms is not None and self.min_lead_ms < 0 else 0)
            + self.gate_violations
        )

    @property
    def gate_violations(self) -> int:
        """Updates lost behind a fence gate (or counted twice): what a gate must prevent."""
        return sum(abs(lost) for _, _, lost in self.gates.values())


def overlapping(sections: list[Section]) -> list[tuple[Section, Section]]:
    """Pairs of sections of different workers that intersect where one of them was
    exclusive (read leases may share; permits are counted by ``beyond``)."""
    found = []
    ordered = sorted((s for s in sections if s.mode != "s"), key=lambda s: s.start)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            if b.start >= a.end:
                break
            if b.worker != a.worker and "x" in (a.mode, b.mode):
                found.append((a, b))
    return found


def beyond(sections: list[Section], limit: int) -> int:
    """How many times a permit was taken while ``limit`` were held already."""
    events = sorted(
        [(s.start, 1) for s in sections if s.mode == "s"]
        + [(s.end, -1) for s in sections if s.mode == "s"]
    )
    held, times = 0, 0
    for _, step in events:  # at equal times an end sorts first: touching is no overlap
        held += step
        times += step > 0 and held > limit
    return times


def longest_gap(sections: list[Section]) -> float:
    """The longest time between the end of a section and the start of the next one
    (of any worker): how long the lock stood idle while someone wanted it."""
    longest, last_end = 0.0, None
    for s in sorted(sections, key=lambda s: s.start):
        if last_end is not None:
            longest = max(longest, s.start - last_end)
        last_end = s.end if last_end is None else max(last_end, s.end)
    return longest


def grant_regressions(sections: list[Section]) -> int:
    """Exclusive sections whose fence is not above every fence of the sections that
    began before they asked for the lock: the grants known to have come before theirs.

    A section's grant lies between its ``asked`` (``start - latency``) and its ``start``,
    so a section that began before another asked was granted first. Sections that merely
    began in some order were not always granted in it: after the server loses its data,
    a holder granted before the loss can begin after a newcomer granted since (a
    multi-lock's first name taken before the loss while it waited for the next; a reply
    read late on a loaded machine). A multi-lock's section carries the least of its
    fences: each name's fences rise, so the least does too.
    """
    # (start, asked, fence) of each exclusive section with a fence, in the order they began
    grants = sorted(
        (s.start, s.start - s.latency, fence)
        for s in sections
        if s.mode == "x" and (fence := s.fence) is not None
    )
    starts = [start for start, _, _ in grants]
    highest = list(itertools.accumulate((fence for _, _, fence in grants), max))
    found = 0
    for _, asked, fence in grants:
        before = bisect.bisect_left(starts, asked)  # how many began before it asked
        found += before > 0 and fence <= highest[before - 1]
    return found


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def check(record: Record) -> Outcome:
    sections = record.sections
    wrote = [s for s in sections if s.outcome != "lost"]
    overlaps = overlapping(wrote)
    accepted = sum(1 for s in wrote if s.outcome == "accepted")
    primitive = getattr(record.plan, "primitive", "")
    limit = int(primitive.split(":")[1]) if primitive.startswith("semaphore:") else 0
    recovery = None
    for heal in record.heals:
        after = [s.start - heal for s in sections if s.start >= heal]
        if after:
            recovery = max(recovery or 0.0, min(after))
    leads = [
        (until - at) * 1000 for w in record.workers for at, until in w.get("notifications", [])
    ]
    latencies = [s.latency * 1000 for s in sections]
    duration = max(record.plan.duration, 1e-9)
    return Outcome(
        record=record,
        completed=len(wrote),
        lost_updates=sum(1 for s in wrote if s.mode == "x") - record.resource.unfenced,
        overlaps=overlaps,
        overlaps_unpaused=sum(1 for a, b in overlaps if not a.paused and not b.paused),
        fenced_lost_updates=accepted - record.resource.fenced if accepted else 0,
        stale_accepted=record.resource.stale_accepted,
        rejected=sum(1 for s in wrote if s.outcome == "rejected"),
        token_regressions=record.resource.fence_regressions,
        # Grants must raise the fence, among exclusive sections (shared ones are granted
        # side by side, in either order).
        grant_regressions=grant_regressions(sections),
        keys_without_ttl=record.keys_without_ttl,
        leftovers=sum(int(w.get("leftovers", 0)) for w in record.workers),
        acquisitions_per_s=len(sections) / duration,
        latency_p50_ms=statistics.median(latencies) if latencies else 0.0,
        latency_p99_ms=_percentile(latencies, 0.99),
        recovery_s=recovery,
        notifications=len(leads),
        min_lead_ms=min(leads) if leads else None,
        timeouts=sum(int(w.get("timeouts", 0)) for w in record.workers),
        errors=sum(len(w.get("errors", [])) for w in record.workers),
        crashed_workers=sum(1 for w in record.workers if "sections" not in w),
        max_gap_s=longest_gap(sections),
        excess=beyond(wrote, limit) if limit else 0,
        gates=_gates(record),
    )


def _gates(record: Record) -> dict[str, tuple[int, int, int]]:
    found = {}
    for gate, final in record.gates.items():
        counts = [w.get("gates", {}).get(gate, [0, 0]) for w in record.workers]
        accepted, stopped = sum(c[0] for c in counts), sum(c[1] for c in counts)
        found[gate] = (accepted, stopped, accepted - final)
    return found
