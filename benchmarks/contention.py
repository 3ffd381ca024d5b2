"""Section 3: several processes contending for one lock name.

Each of N worker processes loops for a fixed time: acquire, read-modify-write a counter
(GET, then SET to the value + 1: not atomic, so only the lock keeps updates from being
lost), release. Measured: critical sections per second (all processes together), the
wait of every acquisition (from calling acquire to holding), fairness (fewest / most
sections completed by one process) and lost updates (sections completed minus the
counter's final value). Contenders alternate round by round, and every round of every
contender runs on a server started for it: runs on fresh servers, whose spread (slowest
and fastest round) the report shows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
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
    percentile,
    server_cpu,
    sleep_until,
    together,
)
from ._locks import CONTENTION, KINDS, client, make_lock
from ._report import NA, Row, ms, rate, times, verdict

TTL = 10.0


def worker(
    kind: str, port: int, name: str, counter: str, start: float, end: float
) -> dict[str, Any]:
    """One contending process (runs in a crew process)."""
    r = client(port)
    r.ping()
    lock = make_lock(kind, r, name, TTL)
    waits: list[float] = []
    on_time = sleep_until(start)
    while True:
        asked = time.monotonic()
        if asked >= end:
            break
        held = lock.acquire(timeout=60.0)
        waits.append(time.monotonic() - asked)
        value = int(r.get(counter) or 0)
        r.set(counter, value + 1)
        lock.release(held)
    done = time.monotonic()
    return {
        "pid": os.getpid(),
        "sections": len(waits),
        "waits": waits,
        "done": done,
        "on_time": on_time,
    }


@dataclass
class Tally:
    kind: str
    rates: list[float] = field(default_factory=list)
    fairness: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    sections: int = 0
    lost: int = 0
    commands: list[float] = field(default_factory=list)  # server commands per section
    cpu: list[float] = field(default_factory=list)  # server CPU seconds per section
    alone: list[float] = field(default_factory=list)  # sections/s of one process, no rival
    processes: set[int] = field(default_factory=set)
    problem: str | None = None


def one_round(
    crew: Crew, kind: str, port: int, processes: int, seconds: float, tag: str, margin: float
) -> dict[str, Any]:
    r = client(port)
    name, counter = f"bench:c:{tag}", f"bench:c:{tag}:counter"
    before: dict[str, Any] = {}

    def calls(start: float) -> list[tuple[Any, ...]]:
        r.delete(counter)
        before.update(calls=command_calls(r), cpu=server_cpu(r))
        return [(kind, port, name, counter, start, start + seconds)] * processes

    start, results = together(crew, worker, calls, margin, seconds)
    sections = [res["sections"] for res in results]
    total = sum(sections)
    final = int(r.get(counter) or 0)
    cpu = server_cpu(r) - before["cpu"]
    spent = calls_between(before["calls"], command_calls(r), handshakes=False)
    commands = sum(v for k, v in spent.items() if not k.endswith(FAILED)) - 1  # the GET above
    finished = max(res["done"] for res in results)
    return {
        "rate": total / (finished - start),
        "fairness": min(sections) / max(sections) if max(sections) else 0.0,
        "waits": [w for res in results for w in res["waits"]],
        "sections": total,
        "lost": total - final,
        "pids": {res["pid"] for res in results},
        "commands": commands / total if total else float("nan"),
        "cpu": cpu / total if total else float("nan"),
    }


# Also measured with one process (no rival, nothing to wait for or wake): the ceiling of
# an unfair lock's rate, whose releasing process barges back in and sets the pace alone.
ALONE = ("redlease-unfair", "redis-py")


def measure(
    crew: Crew, server_kind: str, settings: Settings, kinds: Sequence[str] = CONTENTION
) -> list[Tally]:
    """Every contender's rounds, each on a fresh ``server_kind`` server (the ``ALONE``
    ones also with one process, on the same server after the contended round)."""
    tallies = [Tally(k) for k in kinds]
    for round_no in range(settings.contention_rounds):
        order = tallies if round_no % 2 == 0 else tallies[::-1]
        for tally in order:
            if tally.problem is not None:
                continue
            try:
                with servers.running(1, kind=server_kind) as fresh:
                    got = one_round(
                        crew,
                        tally.kind,
                        fresh[0].port,
                        settings.processes,
                        settings.contention_seconds,
                        f"{tally.kind}:{round_no}",
                        settings.start_margin,
                    )
                    if tally.kind in ALONE:
                        alone = one_round(
                            crew,
                            tally.kind,
                            fresh[0].port,
                            1,
                            settings.contention_seconds,
                            f"{tally.kind}:{round_no}:alone",
                            settings.start_margin,
                        )
                        tally.alone.append(alone["rate"])
            except Exception as exc:
                tally.problem = f"error: {describe_error(exc)}"
                continue
            tally.rates.append(got["rate"])
            tally.fairness.append(got["fairness"])
            tally.waits.extend(got["waits"])
            tally.sections += got["sections"]
            tally.lost += got["lost"]
            tally.processes |= got["pids"]
            tally.commands.append(got["commands"])
            tally.cpu.append(got["cpu"])
    return tallies


def section_title(processes: int) -> str:
    return f"3. {processes} processes contending for one name (GET+SET counter inside)"


# The bars redlease's contenders are held to, by figure: the fair default pays a
# cross-process wake-up per section for its tail and fairness; fair=False is the
# throughput mode. Peers have none.
_BARS: dict[str, dict[str, tuple[str, Callable[[float], bool]]]] = {
    "redlease": {
        "throughput": (">= 0.8x redis-py Lock", lambda x: x >= 0.8),
        "steady": (">= 0.5 slowest/fastest", lambda x: x >= 0.5),
        "commands": ("<= 10", lambda x: x <= 10),
        "p99": ("<= 20 ms", lambda x: x <= 0.020),
        "max": ("<= 200 ms", lambda x: x <= 0.200),
        "fairness": (">= 0.9", lambda x: x >= 0.9),
    },
    "redlease-unfair": {
        "throughput": (">= 1.2x redis-py Lock", lambda x: x >= 1.2),
        "max": ("<= 1 s", lambda x: x <= 1.0),
    },
}


def _bar(kind: str, figure: str, value: float) -> dict[str, Any]:
    """The bar and verdict of one figure of ``kind`` (empty where it has none)."""
    bar = _BARS.get(kind, {}).get(figure)
    if bar is None:
        return {"bar": "", "verdict": ""}
    return {"bar": bar[0], "verdict": verdict(bar[1](value))}


def rows(tallies: Sequence[Tally], processes: int) -> list[Row]:
    section = section_title(processes)
    by_kind = {t.kind: t for t in tallies}
    ref = by_kind.get("redis-py")
    ref_rate = median(ref.rates) if ref and ref.problem is None else float("nan")
    ref_alone = median(ref.alone) if ref and ref.alone else float("nan")
    out: list[Row] = []
    for t in tallies:
        label = KINDS[t.kind]
        mine = t.kind in _BARS
        if t.problem is not None:
            out.append(
                Row(
                    section,
                    label,
                    "critical sections/s",
                    None,
                    t.problem,
                    verdict=NA if mine else "",
                )
            )
            continue
        throughput = median(t.rates)
        against = throughput / ref_rate
        p50, p99, worst = (
            percentile(t.waits, 50),
            percentile(t.waits, 99),
            max(t.waits, default=float("nan")),
        )
        fair = median(t.fairness)
        out.append(
            Row(
                section,
                label,
                "critical sections/s",
                throughput,
                rate(throughput),
                ratio=times(against, "redis-py") if t.kind != "redis-py" else "",
                **_bar(t.kind, "throughput", against),
                extra={"rounds": [round(x, 1) for x in t.rates]},
            )
        )
        if t.alone:
            alone = median(t.alone)
            out.append(
                Row(
                    section,
                    label,
                    "sections/s of 1 process alone (the same loop, no rival)",
                    alone,
                    rate(alone),
                    ratio=times(alone / ref_alone, "redis-py") if t.kind != "redis-py" else "",
                    extra={"rounds": [round(x, 1) for x in t.alone]},
                )
            )
        slowest, fastest = min(t.rates), max(t.rates)
        steady = slowest / fastest if fastest else float("nan")
        out.append(
            Row(
                section,
                label,
                f"sections/s, slowest and fastest of {len(t.rates)} runs (fresh servers)",
                steady,
                f"{rate(slowest)} - {rate(fastest)}",
                ratio=f"{steady:.2f} slowest/fastest",
                **(_bar(t.kind, "steady", steady) if len(t.rates) > 1 else {}),
            )
        )
        spent = median(t.commands)
        out.append(
            Row(
                section,
                label,
                "commands per section (incl. in scripts)",
                spent,
                f"{spent:.1f}",
                **_bar(t.kind, "commands", spent),
            )
        )
        cpu = median(t.cpu) * 1e6
        out.append(Row(section, label, "server CPU per section (INFO cpu)", cpu, f"{cpu:.0f} us"))
        out.append(Row(section, label, "wait p50", p50, ms(p50)))
        out.append(
            Row(
                section,
                label,
                "wait p99",
                p99,
                ms(p99),
                **_bar(t.kind, "p99", p99),
            )
        )
        out.append(
            Row(
                section,
                label,
                "wait max",
                worst,
                ms(worst),
                **_bar(t.kind, "max", worst),
            )
        )
        out.append(
            Row(
                section,
                label,
                "fairness (fewest/most)",
                fair,
                f"{fair:.2f}",
                **_bar(t.kind, "fairness", fair),
                extra={"rounds": [round(x, 3) for x in t.fairness]},
            )
        )
        out.append(
            Row(
                section,
                label,
                "lost updates",
                float(t.lost),
                f"{t.lost} of {t.sections:,}",
                bar="0",
                verdict=verdict(t.lost == 0),
            )
        )
    return out


def run(crew: Crew, server_kind: str, settings: Settings) -> list[Row]:
    return rows(measure(crew, server_kind, settings), settings.processes)
