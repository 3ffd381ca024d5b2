"""The safety report (Markdown) and the timeline picture (SVG, no dependency)."""

from __future__ import annotations

import html
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from .checker import Outcome
from .harness import POSSIBLE, SAFE, VIOLATION, BrokenCase, Scenario


@dataclass
class Row:
    """One scenario, run once per seed (``outcomes``), or not run (``note`` says why)."""

    scenario: Scenario
    outcomes: list[Outcome]
    note: str | None = None


@dataclass
class BrokenRow:
    """One broken lock, run once per seed; ``twins``: redlease under the same faults."""

    case: BrokenCase
    outcomes: list[Outcome]
    twins: list[Outcome]

    @property
    def caught(self) -> int:
        return sum(1 for o in self.outcomes if self.case.caught(o))

    @property
    def twin_caught(self) -> int:
        return sum(1 for o in self.twins if self.case.caught(o))


def _observed(violations: int) -> str:
    return "violation" if violations else "safe"


def verdict(expected: str, violations: int) -> str:
    """ "ok" when the observation matches the expectation, else what went wrong."""
    if expected == SAFE:
        return "ok" if violations == 0 else "UNEXPECTED VIOLATION"
    if expected == VIOLATION:
        return "ok" if violations else "NOT REPRODUCED"
    return "ok"  # POSSIBLE: either is allowed


def outcome_failures(scenario: Scenario, o: Outcome) -> list[str]:
    """What makes one run of a scenario fail the build (empty when it matches)."""
    found = []
    label = f"row {scenario.number}"
    if verdict(scenario.expected_unfenced, o.unfenced_violations) != "ok":
        found.append(
            f"{label} unfenced: {verdict(scenario.expected_unfenced, o.unfenced_violations)}"
        )
    if o.fenced and verdict(scenario.expected_fenced, o.fenced_violations) != "ok":
        found.append(f"{label} fenced: {verdict(scenario.expected_fenced, o.fenced_violations)}")
    if o.crashed_workers:
        found.append(f"{label}: {o.crashed_workers} worker(s) crashed")
    if scenario.available and o.errors:
        found.append(f"{label}: {o.errors} operation(s) failed where none may")
    if scenario.max_gap is not None and o.max_gap_s > scenario.max_gap:
        found.append(
            f"{label}: the lock stood idle {o.max_gap_s * 1000:.0f} ms "
            f"(at most {scenario.max_gap * 1000:.0f} ms)"
        )
    return found


def row_failures(row: Row) -> list[str]:
    return [f for o in row.outcomes for f in outcome_failures(row.scenario, o)]


def broken_failures(row: BrokenRow) -> list[str]:
    """A broken lock must be caught in at least one seeded run (a loaded machine can
    delay another worker into its window past a short run), and redlease never."""
    found = []
    if row.outcomes and not row.caught:
        found.append(f"broken {row.case.key}: not caught in {len(row.outcomes)} run(s)")
    if row.twin_caught:
        found.append(f"broken {row.case.key}: redlease flagged under the same faults")
    return found


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _scenario_line(row: Row) -> str:
    s, runs = row.scenario, row.outcomes
    expected = f"{s.expected_unfenced} / {s.expected_fenced}"
    if not runs:
        return f"| {s.number} | {s.fault} | {expected} | {row.note} |  |  |  |  |  |  |  |  |"

    def total(figure: Callable[[Outcome], int]) -> int:
        return sum(figure(o) for o in runs)

    unfenced = total(lambda o: o.unfenced_violations)
    fenced = total(lambda o: o.fenced_violations)
    unf = f"{_observed(unfenced)}: {total(lambda o: len(o.overlaps) + o.excess)} / "
    unf += f"{total(lambda o: max(0, o.lost_updates))}"
    fen = (
        f"{_observed(fenced)}: {total(lambda o: max(0, o.fenced_lost_updates))} / "
        f"{total(lambda o: o.stale_accepted)} / "
        f"{total(lambda o: o.token_regressions + o.grant_regressions)}"
    )
    recoveries = [o.recovery_s * 1000 for o in runs if o.recovery_s is not None]
    leads = [o.min_lead_ms for o in runs if o.min_lead_ms is not None]
    extra = ""
    if s.max_gap is not None:
        extra = f"; lock idle at most {max(o.max_gap_s for o in runs) * 1000:.0f} ms"
    if leads:
        extra += f"; {total(lambda o: o.notifications)} lost-lease notices, min lead "
        extra += f"{min(leads):.0f} ms"
    for gate, name in (("sql", "SQL gate"), ("redis", "FencedRedis")):
        if any(gate in o.gates for o in runs):
            figures = [o.gates[gate] for o in runs if gate in o.gates]
            extra += (
                f"; {name}: {sum(f[0] for f in figures)} writes, "
                f"{sum(f[1] for f in figures)} stale stopped at the gate, "
                f"{sum(abs(f[2]) for f in figures)} lost"
            )
    return (
        f"| {s.number} | {s.fault} | {expected} | {unf} | {fen} | "
        f"{total(lambda o: o.rejected)} | {total(lambda o: len(o.keys_without_ttl))} | "
        f"{total(lambda o: o.completed)} | "
        f"{statistics.median(o.acquisitions_per_s for o in runs):.0f} | "
        f"{statistics.median(o.latency_p50_ms for o in runs):.1f} / "
        f"{max(o.latency_p99_ms for o in runs):.1f} | "
        f"{_ms(max(recoveries) if recoveries else None)} | "
        f"{'; '.join(row_failures(row)) or 'ok'}{extra} |"
    )


def _broken_figures(runs: list[Outcome]) -> str:
    return (
        f"{sum(len(o.overlaps) for o in runs)} ({sum(o.overlaps_unpaused for o in runs)}) / "
        f"{sum(max(0, o.lost_updates) for o in runs)} / "
        f"{sum(len(o.keys_without_ttl) for o in runs)} / {sum(o.leftovers for o in runs)}"
    )


def render(
    rows: list[Row],
    broken: list[BrokenRow],
    *,
    seeds: list[int],
    server: str,
    processes: str,
    quick: bool,
    timeline: str | None,
) -> str:
    runs = f"{len(seeds)} run" + ("s" if len(seeds) > 1 else "")
    out = [
        "# Safety report",
        "",
        "Produced by `python -m redlease.tools.chaos` (redlease's fault harness). Every run",
        "starts private server processes on 127.0.0.1, N worker processes doing lock-protected",
        "read-modify-writes of two counters on a separate resource server (one plain, one",
        "checked with fencing tokens), and a nemesis injecting the row's faults on a seeded",
        "schedule. The checker compares believed-held intervals on `time.monotonic()`.",
        "",
        f"- seeds: {', '.join(f'`{seed}`' for seed in seeds)} ({runs} of every row and broken "
        f"lock); mode: {'quick' if quick else 'full'}",
        f"- server: {server}",
        f"- worker processes per run: {processes}",
        "",
        "## Scenarios",
        "",
        f"Figures are totals over the {runs} (rates and p50: median; p99 and recovery: worst).",
        "Violations, unfenced: overlapping holds (pairs) / lost updates. Fenced: lost updates /",
        "stale writes accepted / token regressions (accepted at the resource + grants out of",
        "order: a fence not above those of the sections begun before it was asked for). Keys",
        "without TTL count in both. Recovery: time from the fault healing to the",
        "next acquisition. Row 19 checks each primitive's own invariant: overlaps count only",
        "where one side held exclusively (a lock, a leader, a multi-lock, a write lease), and",
        "a semaphore's count is of permits taken beyond its limit; for a semaphore, stale",
        "writes rejected also counts holders of an older permit turned away beside a newer",
        "one (the resource keeps one high-water mark, which cannot tell them apart).",
        "Rows 20 add two more counters, each read and written through one of redlease's",
        "fence gates: one in a PostgreSQL server (`redlease.sql.fence_gate`), one on the",
        "resource server (`FencedRedis`). Their lost updates count as fenced violations; the",
        "verdict column says how many stale writes each gate stopped.",
        "",
        "| # | fault | expected (unfenced / fenced) | observed unfenced: overlaps (or permits "
        "past a semaphore's limit) / lost | "
        "observed fenced: lost / stale accepted / regressions | stale writes rejected | "
        "keys without TTL | sections | acq/s | p50 / p99 ms | recovery ms | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    out += [_scenario_line(row) for row in rows]
    out += [
        "",
        '"violation expected" rows pass only if every run reproduces the violation (no TTL',
        'lock can prevent it; fencing does); "safe" rows pass only with zero violations in',
        f'every run; "{POSSIBLE}" rows pass either way.',
        "",
        "## The checker can fail: broken locks through the same harness",
        "",
        "Each broken lock runs under a fault aimed at its flaw; then redlease runs under the",
        "very same plan and faults, and must come out clean on the measure that catches the",
        "broken lock. Figures: overlaps (of which between unpaused holders) / lost updates /",
        "keys without TTL / released tokens still on a node. Where a holder itself sleeps past",
        "its lease (plain DEL), redlease shows row 3's expected violation too, but only with",
        "that holder: a wrong release lets two holders in that were never paused.",
        "",
        "| broken lock | fault injected | caught by | broken lock's figures | caught | "
        "redlease under the same faults |",
        "|---|---|---|---|---|---|",
    ]
    for row in broken:
        case = row.case
        twin = _broken_figures(row.twins) if row.twins else "not run"
        if row.twins:
            twin += " (clean)" if not row.twin_caught else " (FLAGGED)"
        out.append(
            f"| {case.lock} | {case.window} | {case.catches} | {_broken_figures(row.outcomes)} "
            f"| {row.caught} of {len(row.outcomes)} runs | {twin} |"
        )
    if timeline:
        out += [
            "",
            "## Timeline",
            "",
            "Who held the lock when, in the holder-pause scenario (row 1, unfenced view): one",
            "lane per worker, overlaps in red, faults shaded.",
            "",
            f"![timeline]({timeline})",
        ]
    return "\n".join(out) + "\n"


_COLOURS = ["#4e79a7", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948"]


def timeline_svg(outcome: Outcome, title: str, width: int = 1000) -> str:
    """One lane per worker, a rectangle per believed-held section, overlaps in red."""
    record = outcome.record
    sections = record.sections
    lanes = max([s.worker for s in sections], default=0) + 1
    t0: float = record.start
    t1 = max([s.end for s in sections] + [t0 + record.plan.duration])
    left, top, lane_h = 90, 40, 28
    span: float = max(t1 - t0, 1e-6)
    height = top + lanes * lane_h + 50

    def x(t: float) -> float:
        return float(left + (t - t0) / span * (width - left - 20))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="14">{html.escape(title)}</text>',
    ]
    for start, end, label in record.fault_windows:
        parts.append(
            f'<rect x="{x(start):.1f}" y="{top - 6}" width="{max(1.0, x(end) - x(start)):.1f}" '
            f'height="{lanes * lane_h + 6}" fill="#dddddd"><title>{html.escape(label)}</title>'
            "</rect>"
        )
    for lane in range(lanes):
        y = top + lane * lane_h
        parts.append(f'<text x="8" y="{y + 17}">worker {lane}</text>')
    for s in sections:
        y = top + s.worker * lane_h + 4
        colour = _COLOURS[s.worker % len(_COLOURS)]
        parts.append(
            f'<rect x="{x(s.start):.1f}" y="{y}" width="{max(0.6, x(s.end) - x(s.start)):.1f}" '
            f'height="{lane_h - 8}" fill="{colour}"><title>fence {s.fence}, '
            f"{(s.end - s.start) * 1000:.1f} ms, {s.outcome}</title></rect>"
        )
    for a, b in outcome.overlaps:
        lo, hi = max(a.start, b.start), min(a.end, b.end)
        for s in (a, b):
            y = top + s.worker * lane_h + 2
            parts.append(
                f'<rect x="{x(lo):.1f}" y="{y}" width="{max(1.0, x(hi) - x(lo)):.1f}" '
                f'height="{lane_h - 4}" fill="none" stroke="red" stroke-width="1.5"/>'
            )
    axis_y = top + lanes * lane_h + 15
    for k in range(int(span) + 1):
        parts.append(f'<text x="{x(t0 + k):.1f}" y="{axis_y}">{k}s</text>')
    parts.append(
        f'<text x="{left}" y="{axis_y + 20}">coloured: believed held; red outline: two holders '
        f"at once; grey: fault window ({len(outcome.overlaps)} overlapping pairs)</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
