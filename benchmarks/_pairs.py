"""A cost measured as a pair: the same work without and with what it costs (a fence gate,
a scheduled job's guard), in interleaved rounds of one run; the median of the rounds'
ratios against a bar (or, for a reference figure, none)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ._common import Settings, describe_error, median
from ._report import NA, Row, rate, verdict


@dataclass
class Pair:
    """One kind of work, measured plain (its floor) and through redlease."""

    label: str
    plain: Callable[[], object]
    gated: Callable[[], object]
    bar: float | None  # None: a reference figure, shown without a verdict
    close: Callable[[], None] = lambda: None
    rates: dict[str, list[float]] = field(default_factory=lambda: {"plain": [], "gated": []})
    problem: str | None = None
    # how the rows name the two sides, and what one cycle is
    names: tuple[str, str] = ("ungated", "gated")
    unit: str = "writes/s"


def timed(cycle: Callable[[], object], seconds: float) -> float:
    """Cycles per second of ``cycle`` run for ``seconds`` (a warm-up)."""
    done, start = 0, time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(10):
            cycle()
        done += 10
        now = time.perf_counter()
        if now >= end:
            return done / (now - start)


def alternated(pair: Pair, seconds: float) -> tuple[float, float]:
    """Cycles per second of each side of ``pair``, run for ``seconds`` one cycle of each
    in turn (which goes first alternates), each cycle timed by itself.

    Taking turns cycle by cycle gives both sides the same machine: a shared host's
    speed changes several-fold within a fraction of a second (a virtual CPU that has been
    idle runs a burst up to 4x faster than under steady load), which rounds of one side
    at a time would credit to whichever side ran after a quiet moment."""
    clock = time.perf_counter
    sides = (pair.plain, pair.gated)
    spent = [0.0, 0.0]
    done = 0
    now = clock()
    end = now + seconds
    while now < end:
        for side in (0, 1) if done % 2 == 0 else (1, 0):
            began = clock()
            sides[side]()
            now = clock()
            spent[side] += now - began
        done += 1
    return done / spent[0], done / spent[1]


def measure(pairs: list[Pair], settings: Settings, seed: int) -> None:
    """Each pair's two sides taking turns (``alternated``), in rounds whose order is
    shuffled across the pairs, after a warm-up."""
    rng = random.Random(seed)
    live = [p for p in pairs if p.problem is None]
    for pair in live:  # warm-up: tables, scripts, connections
        for kind in ("plain", "gated"):
            timed(getattr(pair, kind), min(0.05, settings.round_seconds))
    for _ in range(settings.rounds):
        order = list(live)
        rng.shuffle(order)
        for pair in order:
            if pair.problem is not None:
                continue
            try:
                plain, gated = alternated(pair, 2 * settings.round_seconds)
            except Exception as exc:
                pair.problem = f"error: {describe_error(exc)}"
                continue
            pair.rates["plain"].append(plain)
            pair.rates["gated"].append(gated)


def rows(section: str, pair: Pair) -> list[Row]:
    """A pair's rows: each side's rate, then the time ratio against its bar."""
    plain_name, gated_name = pair.names
    bar = "" if pair.bar is None else f"<= {pair.bar:g}x {plain_name}"
    figure = f"time, {gated_name} / {plain_name}"
    if pair.problem is not None:
        flag = NA if bar else ""
        return [Row(section, pair.label, figure, None, pair.problem, bar=bar, verdict=flag)]
    plain, gated = median(pair.rates["plain"]), median(pair.rates["gated"])
    # the ratio within each round, where both sides had the same machine; its median
    cost = median([p / g for p, g in zip(pair.rates["plain"], pair.rates["gated"], strict=True)])
    return [
        Row(
            section,
            f"{pair.label}: {plain_name}",
            pair.unit,
            plain,
            rate(plain),
            extra={"rounds": pair.rates["plain"]},
        ),
        Row(
            section,
            f"{pair.label}: {gated_name}",
            pair.unit,
            gated,
            rate(gated),
            extra={"rounds": pair.rates["gated"]},
        ),
        Row(
            section,
            pair.label,
            figure,
            cost,
            f"{cost:.2f}x",
            bar=bar,
            verdict="" if pair.bar is None else verdict(cost <= pair.bar),
        ),
    ]
