"""Section 15: the server's share. A lock's server is usually shared (the application's
cache and queues), single-threaded: every microsecond it spends on a lock is one every
other client waits. Measured on the server, for each lock in the same run:

* an uncontended cycle (acquire a free name, release it): ``share_processes`` processes
  loop on a name each, so the server is seldom idle between requests (an idle server's
  wake-ups would be charged to whichever client is slowest);
* a contended section (``share_contenders`` processes on one name, the GET+SET counter of
  section 3 inside, which is the same for every lock and counted in).

Server CPU is ``INFO cpu`` (user + system: everything the server does, its network
included), read at the start and end of each round by this process; commands are
``INFO commandstats`` calls, a script's own calls included. Rounds alternate their order
and each runs on a fresh server; figures are medians of rounds, and a ratio is the median
of the ratios of each round (both measured on the same server, seconds apart: the
machine's state moves a round's figures by a fifth, mostly for every lock alike).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redlease.tools import servers

from ._common import (
    FAILED,
    Crew,
    Settings,
    calls_between,
    command_calls,
    describe_error,
    median,
    server_cpu,
    sleep_until,
)
from ._locks import KINDS, client, make_lock
from ._report import NA, Row, verdict
from .contention import one_round

SECTION = "15. the server's share: its CPU and commands per cycle and per contended section"
TTL = 10.0
# (the ticket baton: the floor under any fair lock's hand-over, not a usable lock)
SHARE = ("redlease", "redlease-unfair", "redis-py", "python-redis-lock", "pottery", "ticket")
# The bars, as ratios to redis-py's Lock in the same run: (uncontended, contended).
BARS = {"redlease": (1.3, 1.5), "redlease-unfair": (1.3, 1.3)}
_WARM = 50  # cycles before the window: scripts loaded, connections made


def cycle_worker(kind: str, port: int, name: str, start: float, end: float) -> dict[str, Any]:
    """One uncontended process (runs in a crew process): cycles on its own name."""
    lock = make_lock(kind, client(port), name, TTL)
    for _ in range(_WARM):
        lock.release(lock.acquire(timeout=5.0))
    on_time = sleep_until(start)
    cycles = 0
    while time.monotonic() < end:
        lock.release(lock.acquire(timeout=5.0))
        cycles += 1
    return {"cycles": cycles, "on_time": on_time}


@dataclass
class Tally:
    kind: str
    cycle_cpu: list[float] = field(default_factory=list)  # seconds per cycle, by round
    cycle_commands: list[float] = field(default_factory=list)
    section_cpu: list[float] = field(default_factory=list)  # seconds per section
    section_commands: list[float] = field(default_factory=list)
    problem: str | None = None


def _uncontended(
    crew: Crew, kind: str, port: int, settings: Settings, tag: str
) -> tuple[float, float]:
    """Server CPU seconds and commands per cycle of one round: the counters are read by
    this process at the window's start and end, while the workers' warm-up has ended
    and their loops run."""
    r = client(port)
    margin = settings.start_margin
    for _ in range(4):
        start = time.monotonic() + margin + 0.2  # (and the warm-up's cycles)
        end = start + settings.share_seconds
        futures = [
            crew.submit(cycle_worker, kind, port, f"bench:share:{tag}:{i}", start, end)
            for i in range(settings.share_processes)
        ]
        sleep_until(start)
        cpu, calls = server_cpu(r), command_calls(r)
        sleep_until(end)
        cpu, calls = server_cpu(r) - cpu, calls_between(calls, command_calls(r), handshakes=False)
        done = [f.result(timeout=120) for f in concurrent.futures.as_completed(futures)]
        if all(res["on_time"] for res in done):
            cycles = sum(res["cycles"] for res in done)
            commands = sum(n for k, n in calls.items() if not k.endswith(FAILED)) - 1  # (INFO)
            return cpu / cycles, commands / cycles
        margin *= 2
    raise RuntimeError("workers not set up in time")


def measure(crew: Crew, server_kind: str, settings: Settings) -> list[Tally]:
    tallies = [Tally(k) for k in SHARE]
    for round_no in range(settings.share_rounds):
        order = tallies if round_no % 2 == 0 else tallies[::-1]
        with servers.running(1, kind=server_kind) as fresh:
            port = fresh[0].port
            for tally in order:
                if tally.problem is not None:
                    continue
                tag = f"{tally.kind}:{round_no}"
                try:
                    cpu, commands = _uncontended(crew, tally.kind, port, settings, tag)
                    got = one_round(
                        crew,
                        tally.kind,
                        port,
                        settings.share_contenders,
                        settings.share_seconds,
                        f"share:{tag}",
                        settings.start_margin,
                    )
                except Exception as exc:
                    tally.problem = f"error: {describe_error(exc)}"
                    continue
                tally.cycle_cpu.append(cpu)
                tally.cycle_commands.append(commands)
                tally.section_cpu.append(got["cpu"])
                tally.section_commands.append(got["commands"])
    return tallies


def _per_round(cpus: Sequence[float], against: Sequence[float]) -> float:
    """The median of the rounds' ratios of ``cpus`` to ``against`` (NaN without rounds)."""
    ratios = [c / a for c, a in zip(cpus, against, strict=True)]
    return median(ratios) if ratios else float("nan")


def rows(tallies: Sequence[Tally], settings: Settings) -> list[Row]:
    by_kind = {t.kind: t for t in tallies}
    ref = by_kind.get("redis-py")
    usable = ref is not None and ref.problem is None and ref.cycle_cpu
    ref_cycle = ref.cycle_cpu if usable and ref else []
    ref_section = ref.section_cpu if usable and ref else []
    contended = f"per section ({settings.share_contenders} processes, one name)"
    ticket = by_kind.get("ticket")
    floor = (
        ticket.section_cpu
        if ticket is not None and ticket.problem is None and ticket.section_cpu
        else None
    )
    out: list[Row] = []
    for t in tallies:
        label = KINDS[t.kind]
        bars = BARS.get(t.kind)
        if t.problem is not None:
            shown = t.problem
            out.append(Row(SECTION, label, "server CPU per cycle", None, shown, verdict=NA))
            continue
        for figure, cpus, commands, against, bar in (
            ("per uncontended cycle", t.cycle_cpu, t.cycle_commands, ref_cycle, 0),
            (contended, t.section_cpu, t.section_commands, ref_section, 1),
        ):
            cpu = median(cpus)
            ratio = _per_round(cpus, against) if against else float("nan")
            limit = bars[bar] if bars else None
            out.append(
                Row(
                    SECTION,
                    label,
                    f"server CPU {figure}",
                    cpu * 1e6,
                    f"{cpu * 1e6:.0f} us",
                    ratio=f"{ratio:.2f}x redis-py" if t.kind != "redis-py" else "",
                    bar=f"<= {limit}x redis-py Lock" if limit else "",
                    verdict=verdict(ratio <= limit) if limit else "",
                    extra={
                        "rounds_us": [round(c * 1e6, 1) for c in cpus],
                        "rounds_ratio": [
                            round(c / a, 3) for c, a in zip(cpus, against, strict=True)
                        ]
                        if against
                        else [],  # (the reference failed: no ratio)
                    },
                )
            )
            spent = median(commands)
            out.append(
                Row(SECTION, label, f"commands {figure} (incl. in scripts)", spent, f"{spent:.1f}")
            )
        if t.kind == "redlease" and floor:
            over = _per_round(t.section_cpu, floor)
            out.append(
                Row(
                    SECTION,
                    label,
                    "server CPU per section, over the ticket baton's",
                    over,
                    f"{over:.2f}x ticket",
                )
            )
    return out


def run(crew: Crew, server_kind: str, settings: Settings) -> list[Row]:
    return rows(measure(crew, server_kind, settings), settings)


def note(settings: Settings) -> str:
    return (
        f"the server's share: {settings.share_rounds} rounds, each on a fresh server, of "
        f"{settings.share_seconds:g} s uncontended ({settings.share_processes} processes, "
        f"a name each) and {settings.share_seconds:g} s contended "
        f"({settings.share_contenders} processes, one name, the GET+SET counter inside and "
        "counted); server CPU from INFO cpu (user + system), commands from INFO "
        "commandstats (scripts' own calls included); medians of rounds, ratios the medians "
        "of each round's ratio."
    )
