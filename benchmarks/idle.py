"""Section 5: what blocked waiters cost the server while nothing happens.

This process takes the lock (a ttl far longer than the window, so nothing expires and
the holder sends nothing); K worker processes then block in acquire. After they settle,
the server's ``INFO commandstats`` is read before and after a quiet window of T seconds;
the commands counted in between (without the INFO calls themselves, and the holder's,
which are none) divided by K and T are the commands per second per idle waiter.
Commands run inside scripts count too; connection handshakes (HELLO, CLIENT SETINFO...)
do not, as they are sent once per connection, not per wait. Then the holder releases
and the waiters take the lock in turn and leave.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._common import FAILED, Crew, Settings, calls_between, command_calls, describe_error
from ._locks import KINDS, PEERS, client, make_lock
from ._report import NA, Row, verdict

SECTION = "5. idle waiters: commands the server receives while the lock stays held"
HOLD_TTL = 120.0
HOLDER_COMMANDS_IN_WINDOW = 0  # the holder does nothing while the window is open


def wait_once(kind: str, port: int, name: str) -> float:
    r = client(port)
    lock = make_lock(kind, r, name, HOLD_TTL)
    asked = time.monotonic()
    held = lock.acquire(timeout=HOLD_TTL)
    waited = time.monotonic() - asked
    lock.release(held)
    return waited


@dataclass
class Tally:
    kind: str
    per_waiter: float = float("nan")
    commands: dict[str, int] = field(default_factory=dict)
    blocked: int = 0
    problem: str | None = None


def measure_one(
    crew: Crew, port: int, kind: str, waiters: int, seconds: float, settle: float
) -> Tally:
    r = client(port)
    name = f"bench:i:{kind}"
    tally = Tally(kind)
    lock = make_lock(kind, r, name, HOLD_TTL)
    held = lock.acquire(timeout=5.0)
    futures = []
    try:
        futures = [crew.submit(wait_once, kind, port, name) for _ in range(waiters)]
        time.sleep(settle)
        before = command_calls(r)
        opened = time.monotonic()
        time.sleep(seconds)
        after = command_calls(r)
        window = time.monotonic() - opened
        blocked: Any = r.info("clients").get("blocked_clients", 0)
        tally.blocked = int(blocked)
        if any(f.done() for f in futures):
            raise RuntimeError("a waiter stopped waiting while the lock was held")
        every = calls_between(before, after)
        tally.commands = {k: v for k, v in every.items() if not k.endswith(FAILED)}
        counted = calls_between(before, after, handshakes=False)
        total = sum(v for k, v in counted.items() if not k.endswith(FAILED))
        total -= HOLDER_COMMANDS_IN_WINDOW
        tally.per_waiter = total / waiters / window
    finally:
        lock.release(held)
        for future in futures:
            future.result(timeout=HOLD_TTL + 30)
    return tally


def measure(crew: Crew, port: int, settings: Settings, kinds: Sequence[str] = PEERS) -> list[Tally]:
    tallies = []
    for kind in kinds:
        try:
            tallies.append(
                measure_one(
                    crew,
                    port,
                    kind,
                    settings.idle_waiters,
                    settings.idle_seconds,
                    settings.idle_settle,
                )
            )
        except Exception as exc:
            tallies.append(Tally(kind, problem=f"error: {describe_error(exc)}"))
    return tallies


def rows(tallies: Sequence[Tally], waiters: int, seconds: float) -> list[Row]:
    out = []
    for t in tallies:
        label = KINDS[t.kind]
        mine = t.kind == "redlease"
        figure = f"commands/s per waiter ({waiters} waiters, {seconds:g} s)"
        if t.problem is not None:
            out.append(Row(SECTION, label, figure, None, t.problem, verdict=NA if mine else ""))
            continue
        out.append(
            Row(
                SECTION,
                label,
                figure,
                t.per_waiter,
                f"{t.per_waiter:.2f}",
                bar="0" if mine else "",
                verdict=verdict(t.per_waiter == 0) if mine else "",
                extra={"commands": t.commands, "blocked_clients": t.blocked},
            )
        )
    return out


def run(crew: Crew, port: int, settings: Settings) -> list[Row]:
    return rows(measure(crew, port, settings), settings.idle_waiters, settings.idle_seconds)
