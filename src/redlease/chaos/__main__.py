"""``python -m redlease.chaos``: run the fault scenarios and the broken locks, print the
report, optionally write it (``--report``) and the timeline picture (``--timeline``).
Exit status 1 when a row does not match its expectation or a broken lock goes uncaught.
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import servers
from .harness import BROKEN, SCENARIOS, run_broken, run_scenario
from .report import Row, render, row_failures, timeline_svg


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="redlease chaos", description="Fault-injection harness and safety report."
    )
    parser.add_argument("--quick", action="store_true", help="short runs (as in CI)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault schedule")
    parser.add_argument(
        "--scenario",
        type=int,
        action="append",
        choices=sorted(SCENARIOS),
        metavar="N",
        help="run only row N of the scenario table (repeatable)",
    )
    parser.add_argument("--no-broken", action="store_true", help="skip the broken locks")
    parser.add_argument("--report", help="write the Markdown report here")
    parser.add_argument("--timeline", help="write the timeline picture (SVG) here")
    parser.add_argument("--server-kind", choices=["redis", "valkey"], default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    binary = servers.find_binary(options.server_kind)
    rows: list[Row] = []
    for number in options.scenario or sorted(SCENARIOS):
        scenario, outcome, note = run_scenario(number, binary, options.seed, options.quick)
        rows.append(Row(scenario, outcome, note))
        print(f"row {number}: {note or '; '.join(row_failures(rows[-1])) or 'ok'}", flush=True)
    broken = []
    if not options.no_broken:
        for key in BROKEN:
            case, outcome = run_broken(key, binary, options.seed)
            broken.append((case, outcome))
            print(f"broken {key}: {'caught' if case.caught(outcome) else 'NOT CAUGHT'}", flush=True)
    timeline_ref = None
    if options.timeline:
        pictured = next((r for r in rows if r.outcome is not None and r.scenario.row == 1), None)
        pictured = pictured or next((r for r in rows if r.outcome is not None), None)
        if pictured is not None and pictured.outcome is not None:
            with open(options.timeline, "w") as f:
                f.write(
                    timeline_svg(
                        pictured.outcome,
                        f"row {pictured.scenario.row}: "
                        f"{pictured.scenario.fault} (seed {options.seed})",
                    )
                )
            base = os.path.dirname(os.path.abspath(options.report or "."))
            timeline_ref = os.path.relpath(os.path.abspath(options.timeline), base)
    processes = sorted({str(r.outcome.record.plan.processes) for r in rows if r.outcome})
    text = render(
        rows,
        broken,
        seed=options.seed,
        server=f"{binary.kind} {binary.version()}",
        processes=", ".join(processes) or "-",
        quick=options.quick,
        timeline=timeline_ref,
    )
    if options.report:
        with open(options.report, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    failures = [f for r in rows for f in row_failures(r)]
    failures += [f"broken {c.key} not caught" for c, o in broken if not c.caught(o)]
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
