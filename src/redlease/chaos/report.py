"""The safety report (Markdown) and the timeline picture (SVG, no dependency)."""

from __future__ import annotations

import html
from dataclasses import dataclass

from .checker import Outcome
from .harness import POSSIBLE, SAFE, VIOLATION, BrokenCase, Scenario


@dataclass
class Row:
    scenario: Scenario
    outcome: Outcome | None
    note: str | None


def _observed(violations: int) -> str:
    return "violation" if violations else "safe"


def verdict(expected: str, violations: int) -> str:
    """ "ok" when the observation matches the expectation, else what went wrong."""
    if expected == SAFE:
        return "ok" if violations == 0 else "UNEXPECTED VIOLATION"
    if expected == VIOLATION:
        return "ok" if violations else "NOT REPRODUCED"
    return "ok"  # POSSIBLE: either is allowed


def row_failures(row: Row) -> list[str]:
    """What makes this row fail the build (empty when it matches its expectations)."""
    if row.outcome is None:
        return []
    o, s = row.outcome, row.scenario
    found = []
    if verdict(s.expected_unfenced, o.unfenced_violations) != "ok":
        found.append(f"row {s.row} unfenced: {verdict(s.expected_unfenced, o.unfenced_violations)}")
    if o.fenced and verdict(s.expected_fenced, o.fenced_violations) != "ok":
        found.append(f"row {s.row} fenced: {verdict(s.expected_fenced, o.fenced_violations)}")
    if o.crashed_workers:
        found.append(f"row {s.row}: {o.crashed_workers} worker(s) crashed")
    return found


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def render(
    rows: list[Row],
    broken: list[tuple[BrokenCase, Outcome]],
    *,
    seed: int,
    server: str,
    processes: str,
    quick: bool,
    timeline: str | None,
) -> str:
    out = [
        "# Safety report",
        "",
        "Produced by `python -m redlease.chaos` (the fault harness of SAFETY.md). Every run",
        "starts private server processes on 127.0.0.1, N worker processes doing lock-protected",
        "read-modify-writes of two counters on a separate resource server (one plain, one",
        "checked with fencing tokens), and a nemesis injecting the row's faults on a seeded",
        "schedule. The checker compares believed-held intervals on `time.monotonic()`.",
        "",
        f"- seed: `{seed}`; mode: {'quick' if quick else 'full'}",
        f"- server: {server}",
        f"- worker processes per run: {processes}",
        "",
        "## Scenarios",
        "",
        "Violations, unfenced: overlapping holds (pairs) / lost updates. Fenced: lost updates /",
        "stale writes accepted / token regressions (accepted at the resource + grants out of",
        "order). Keys without TTL count in both. Recovery: time from the fault healing to the",
        "next acquisition.",
        "",
        "| # | fault | expected (unfenced / fenced) | observed unfenced: overlaps / lost | "
        "observed fenced: lost / stale accepted / regressions | stale writes rejected | "
        "keys without TTL | sections | acq/s | p50 / p99 ms | recovery ms | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s, o = row.scenario, row.outcome
        expected = f"{s.expected_unfenced} / {s.expected_fenced}"
        if o is None:
            out.append(f"| {s.row} | {s.fault} | {expected} | {row.note} |  |  |  |  |  |  |  |  |")
            continue
        unf = f"{_observed(o.unfenced_violations)}: {len(o.overlaps)} / {max(0, o.lost_updates)}"
        regressions = o.token_regressions + o.grant_regressions
        fen = (
            f"{_observed(o.fenced_violations)}: {max(0, o.fenced_lost_updates)} / "
            f"{o.stale_accepted} / {regressions}"
        )
        extra = ""
        if o.notifications:
            extra = f"; {o.notifications} lost-lease notices, min lead {o.min_lead_ms:.0f} ms"
        failures = row_failures(row)
        out.append(
            f"| {s.row} | {s.fault} | {expected} | {unf} | {fen} | {o.rejected} | "
            f"{len(o.keys_without_ttl)} | {o.completed} | {o.acquisitions_per_s:.0f} | "
            f"{o.latency_p50_ms:.1f} / {o.latency_p99_ms:.1f} | "
            f"{_ms(None if o.recovery_s is None else o.recovery_s * 1000)} | "
            f"{'; '.join(failures) or 'ok'}{extra} |"
        )
    out += [
        "",
        '"violation expected" rows pass only if the violation is reproduced (no TTL lock can',
        'prevent it; fencing does); "safe" rows pass only with zero violations;',
        f'"{POSSIBLE}" rows pass either way.',
        "",
        "## The checker can fail: broken locks through the same harness",
        "",
        "| broken lock | fault injected | caught by | overlaps (unpaused) | lost updates | "
        "keys without TTL | caught |",
        "|---|---|---|---|---|---|---|",
    ]
    for case, o in broken:
        out.append(
            f"| {case.lock} | {case.window} | {case.catches} | {len(o.overlaps)} "
            f"({o.overlaps_unpaused}) | {max(0, o.lost_updates)} | {len(o.keys_without_ttl)} | "
            f"{'yes' if case.caught(o) else 'NO'} |"
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
