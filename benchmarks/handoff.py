"""Section 4: handoff latency between two processes.

Process A takes the lock and then lets process B start acquiring (B blocks). After a
hold drawn at random between 15 and 115 ms (so that a poller's phase is random too; a
fixed hold would always land at the same point of its 100 ms sleep) A reads the clock
and releases; B reads the clock as soon as its acquire returns. The latency is B's time
minus A's (``time.monotonic()`` is one system-wide clock on Linux). A and B pass their
"go" and "done" signals through lists on the same server, outside the timed part.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._common import Crew, Settings, describe_error, percentile
from ._locks import KINDS, PEERS, client, make_lock
from ._report import NA, Row, ms, verdict

SECTION = "4. handoff: A releases, B (blocked in acquire) holds"
TTL = 10.0
SIGNAL_TIMEOUT = 30  # seconds; only reached if the other side died


def holder(kind: str, port: int, tag: str, reps: int, hold: float, spread: float) -> list[float]:
    r = client(port)
    lock = make_lock(kind, r, f"bench:h:{tag}", TTL)
    go, done = f"bench:h:{tag}:go", f"bench:h:{tag}:done"
    latencies = []
    rng = random.Random(tag)
    for i in range(reps):
        held = lock.acquire(timeout=60.0)
        r.rpush(go, i)
        time.sleep(hold + rng.uniform(0, spread))  # B is now blocked in acquire
        released = time.monotonic()
        lock.release(held)
        reply = r.blpop([done], SIGNAL_TIMEOUT)
        if reply is None:
            raise TimeoutError("handoff: the waiting process never reported")
        latencies.append(float(reply[1]) - released)
    return latencies


def waiter(kind: str, port: int, tag: str, reps: int) -> None:
    r = client(port)
    lock = make_lock(kind, r, f"bench:h:{tag}", TTL)
    go, done = f"bench:h:{tag}:go", f"bench:h:{tag}:done"
    for _ in range(reps):
        if r.blpop([go], SIGNAL_TIMEOUT) is None:
            raise TimeoutError("handoff: the holding process never signalled")
        held = lock.acquire(timeout=60.0)
        acquired = time.monotonic()
        lock.release(held)
        r.rpush(done, repr(acquired))


@dataclass
class Tally:
    kind: str
    latencies: list[float] = field(default_factory=list)
    problem: str | None = None


def measure(crew: Crew, port: int, settings: Settings, kinds: Sequence[str] = PEERS) -> list[Tally]:
    tallies = [Tally(k) for k in kinds]
    reps = settings.handoff_reps
    for round_no in range(settings.handoff_rounds):
        order = tallies if round_no % 2 == 0 else tallies[::-1]
        for tally in order:
            if tally.problem is not None:
                continue
            tag = f"{tally.kind}:{round_no}"
            client(port).delete(f"bench:h:{tag}:go", f"bench:h:{tag}:done")
            try:
                b = crew.submit(waiter, tally.kind, port, tag, reps)
                a = crew.submit(
                    holder,
                    tally.kind,
                    port,
                    tag,
                    reps,
                    settings.handoff_hold,
                    settings.handoff_spread,
                )
                latencies: Any = a.result(timeout=reps * 2 + 60)
                b.result(timeout=60)
            except Exception as exc:
                tally.problem = f"error: {describe_error(exc)}"
                continue
            tally.latencies.extend(latencies)
    return tallies


def rows(tallies: Sequence[Tally]) -> list[Row]:
    out: list[Row] = []
    for t in tallies:
        label = KINDS[t.kind]
        mine = t.kind == "redlease"
        if t.problem is not None:
            out.append(
                Row(SECTION, label, "handoff p50", None, t.problem, verdict=NA if mine else "")
            )
            continue
        p50, p90 = percentile(t.latencies, 50), percentile(t.latencies, 90)
        out.append(
            Row(
                SECTION,
                label,
                "handoff p50",
                p50,
                ms(p50),
                bar="<= 1 ms" if mine else "",
                verdict=verdict(p50 <= 0.001) if mine else "",
                extra={"count": len(t.latencies)},
            )
        )
        out.append(Row(SECTION, label, "handoff p90", p90, ms(p90)))
    return out


def run(crew: Crew, port: int, settings: Settings) -> list[Row]:
    return rows(measure(crew, port, settings))
