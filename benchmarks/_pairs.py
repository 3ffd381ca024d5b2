"""A cost measured as a pair: the same work without and with what it costs (a fence gate,
a scheduled job's guard), in interleaved rounds of one run; the ratio of their medians
against a bar."""

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
    bar: float
    close: Callable[[], None] = lambda: None
    rates: dict[str, list[float]] = field(default_factory=lambda: {"plain": [], "gated": []})
    problem: str | None = None
    # how the rows name the two sides, and what one cycle is
    names: tuple[str, str] = ("ungated", "gated")
    unit: str = "writes/s"


def timed(cycle: Callable[[], object], seconds: float) -> float:
    """Cycles per second of ``cycle`` run for ``seconds``."""
    done, start = 0, time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(10):
            cycle()
        done += 10
        now = time.perf_counter()
        if now >= end:
            return done / (now - start)


def measure(pairs: list[Pair], settings: Settings, seed: int) -> None:
    """Each pair's two sides, in rounds shuffled across every pair (a warm-up first)."""
    rng = random.Random(seed)
    live = [p for p in pairs if p.problem is None]
    for pair in live:  # warm-up: tables, scripts, connections
        for kind in ("plain", "gated"):
            timed(getattr(pair, kind), min(0.05, settings.round_seconds))
    for _ in range(settings.rounds):
        order = [(p, k) for p in live for k in ("plain", "gated")]
        rng.shuffle(order)
        for pair, kind in order:
            if pair.problem is not None:
                continue
            try:
                pair.rates[kind].append(timed(getattr(pair, kind), settings.round_seconds))
            except Exception as exc:
                pair.problem = f"error: {describe_error(exc)}"


def rows(section: str, pair: Pair) -> list[Row]:
    """A pair's rows: each side's rate, then the time ratio against its bar."""
    plain_name, gated_name = pair.names
    bar = f"<= {pair.bar:g}x {plain_name}"
    figure = f"time, {gated_name} / {plain_name}"
    if pair.problem is not None:
        return [Row(section, pair.label, figure, None, pair.problem, bar=bar, verdict=NA)]
    plain, gated = median(pair.rates["plain"]), median(pair.rates["gated"])
    cost = plain / gated
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
            verdict=verdict(cost <= pair.bar),
        ),
    ]
