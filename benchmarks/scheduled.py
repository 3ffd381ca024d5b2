"""Section 14: what a scheduled job's guard (``redlease.once``) costs, in interleaved
rounds of one run: a skipped call (the name held; or, with ``every``, the period run)
against a busy ``Lock.try_acquire`` (one round trip each), and a run (its try, then its
release) against a lock's cycle (``with lock:``), with a job that does nothing."""

from __future__ import annotations

import redis

import redlease

from ._common import Settings
from ._pairs import Pair, measure, rows
from ._report import Row

SECTION = "14. scheduled jobs: a skipped call and a run, against the lock's try and cycle"
BAR = 1.3  # a skip at most this times a busy try; a run, a lock's cycle
_NAMES = ("Lock", "once")


def _nothing() -> None:
    return None


def run(port: int, settings: Settings, seed: int = 1) -> list[Row]:
    client = redis.Redis(port=port)
    held = redlease.Lock(client, "bench:once:held", ttl=3600).acquire()
    busy = redlease.Lock(client, "bench:once:held")
    free = redlease.Lock(client, "bench:once:lock")
    daily = redlease.Once(client, "bench:once:daily", at_most=60, every=86400)(_nothing)
    daily()  # the day's run: every later call is skipped (a new day's would run, once)

    def busy_try() -> None:
        busy.try_acquire()

    def lock_cycle() -> None:
        with free:
            pass

    pairs = [
        Pair(
            "a skipped call (the name held) against a busy try_acquire",
            busy_try,
            redlease.Once(client, "bench:once:held", at_most=60)(_nothing),
            BAR,
            names=_NAMES,
            unit="calls/s",
        ),
        Pair(
            "a skipped call (every=, the period run) against a busy try_acquire",
            busy_try,
            daily,
            BAR,
            names=_NAMES,
            unit="calls/s",
        ),
        Pair(
            "a run (try, then release) against a lock's cycle",
            lock_cycle,
            redlease.Once(client, "bench:once:run", at_most=60)(_nothing),
            BAR,
            names=_NAMES,
            unit="cycles/s",
        ),
    ]
    try:
        measure(pairs, settings, seed)
    finally:
        held.release()
        client.close()
    return [row for pair in pairs for row in rows(SECTION, pair)]


def note(settings: Settings) -> str:
    return (
        f"scheduled jobs: {settings.rounds} rounds of {2 * settings.round_seconds:g} s per "
        "figure, in which once's call and the lock's take turns, one call each, each timed "
        "by itself; time ratio = the lock's calls/s over once's in the same round, the "
        "median of rounds (rates: medians of rounds). A "
        "skipped call and a busy try are one round trip each; a run and a lock's cycle, two."
    )
