"""``python -m redlease.tools.chaos``: run the fault scenarios and the broken locks (each once per
seed; the broken locks' faults then once more with redlease), print the report, optionally
write it (``--report``) and the timeline picture (``--timeline``). Exit status 1 when a run
does not match its row's expectation, a broken lock goes uncaught in every run, or
redlease is flagged under a broken lock's faults.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import servers
from .checker import Outcome
from .harness import BROKEN, SCENARIOS, run_broken, run_scenario
from .report import (
    BrokenRow,
    Row,
    broken_failures,
    outcome_failures,
    render,
    row_failures,
    timeline_svg,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="redlease chaos", description="Fault-injection harness and safety report."
    )
    parser.add_argument("--quick", action="store_true", help="short runs (as in CI)")
    parser.add_argument(
        "--seed",
        type=int,
        action="append",
        metavar="N",
        help="seed of the fault schedule; repeat to run everything once per seed (default 1)",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=list(SCENARIOS),
        metavar="N",
        help="run only row N of the scenario table (repeatable; e.g. 1, 13b)",
    )
    parser.add_argument("--no-broken", action="store_true", help="skip the broken locks")
    parser.add_argument("--report", help="write the Markdown report here")
    parser.add_argument("--timeline", help="write the timeline picture (SVG) here")
    parser.add_argument("--server-kind", choices=["redis", "valkey"], default=None)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print a summary as JSON on stdout (progress on stderr; the Markdown report "
        "only with --report)",
    )
    return parser


_progress = sys.stdout  # stderr with --json, whose stdout carries the summary alone


def _print(text: str) -> None:
    print(text, file=_progress, flush=True)


def _counts(o: Outcome) -> dict[str, object]:
    """A run's violation counters that are not zero (the JSON summary's detail)."""
    counts: dict[str, object] = {
        "overlaps": len(o.overlaps),
        "overlaps_unpaused": o.overlaps_unpaused,
        "lost_updates": max(0, o.lost_updates),
        "excess_permits": o.excess,
        "fenced_lost_updates": max(0, o.fenced_lost_updates),
        "stale_accepted": o.stale_accepted,
        "token_regressions": o.token_regressions,
        "grant_regressions": o.grant_regressions,
        "keys_without_ttl": o.keys_without_ttl,
        "leftovers": o.leftovers,
        "negative_lead_ms": o.min_lead_ms if (o.min_lead_ms or 0) < 0 else 0,
        "gate_violations": o.gate_violations,
        "crashed_workers": o.crashed_workers,
        "errors": o.errors,
    }
    return {k: v for k, v in counts.items() if v}


def main(argv: list[str] | None = None) -> int:
    global _progress
    options = _parser().parse_args(argv)
    _progress = sys.stderr if options.json else sys.stdout
    seeds: list[int] = options.seed or [1]
    binary = servers.find_binary(options.server_kind)
    rows: list[Row] = []
    for number in options.scenario or list(SCENARIOS):
        row = Row(SCENARIOS[number], [])
        for seed in seeds:
            _, outcome, row.note = run_scenario(number, binary, seed, options.quick)
            if outcome is None:
                break
            row.outcomes.append(outcome)
        rows.append(row)
        _print(f"row {row.scenario.number}: {row.note or '; '.join(row_failures(row)) or 'ok'}")
    broken: list[BrokenRow] = []
    if not options.no_broken:
        for key, case in BROKEN.items():
            row_b = BrokenRow(case, [], [])
            for seed in seeds:
                row_b.outcomes.append(run_broken(key, binary, seed)[1])
                row_b.twins.append(run_broken(key, binary, seed, twin=True)[1])
            broken.append(row_b)
            _print(
                f"broken {key}: caught in {row_b.caught} of {len(seeds)}, redlease "
                f"flagged in {row_b.twin_caught}"
            )
    timeline_ref = None
    if options.timeline:
        pictured = next((r for r in rows if r.outcomes and r.scenario.row == 1), None)
        pictured = pictured or next((r for r in rows if r.outcomes), None)
        if pictured is not None:
            with open(options.timeline, "w") as f:
                f.write(
                    timeline_svg(
                        pictured.outcomes[0],
                        f"row {pictured.scenario.number}: "
                        f"{pictured.scenario.fault} (seed {seeds[0]})",
                    )
                )
            base = os.path.dirname(os.path.abspath(options.report or "."))
            timeline_ref = os.path.relpath(os.path.abspath(options.timeline), base)
    processes = sorted({str(o.record.plan.processes) for r in rows for o in r.outcomes})
    text = render(
        rows,
        broken,
        seeds=seeds,
        server=f"{binary.kind} {binary.version()}",
        processes=", ".join(processes) or "-",
        quick=options.quick,
        timeline=timeline_ref,
    )
    if options.report:
        with open(options.report, "w") as f:
            f.write(text)
    elif not options.json:
        sys.stdout.write(text)
    failures = [f for r in rows for f in row_failures(r)]
    failures += [f for b in broken for f in broken_failures(b)]
    if options.json:
        summary = {
            "seeds": seeds,
            "server": f"{binary.kind} {binary.version()}",
            "rows": [
                {
                    "row": r.scenario.number,
                    "fault": r.scenario.fault,
                    "runs": len(r.outcomes),
                    "note": r.note or None,
                    "failures": row_failures(r),
                    # what each failing run counted, by seed
                    "violations": {
                        str(seed): _counts(o)
                        for seed, o in zip(seeds, r.outcomes, strict=False)
                        if outcome_failures(r.scenario, o)
                    },
                }
                for r in rows
            ],
            "broken": [
                {"lock": key, "caught": b.caught, "redlease_flagged": b.twin_caught}
                for key, b in zip(BROKEN, broken, strict=False)
            ],
            "ok": not failures,
        }
        print(json.dumps(summary))
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
