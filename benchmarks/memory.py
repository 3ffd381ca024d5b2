"""Section 9: server memory kept for lock names.

A service that locks per request (``orders:<n>``) takes each name once and never again,
so whatever the server keeps for a name after its release it keeps for every name ever
used: unless every key redlease writes expires, memory grows without bound. On a fresh
server, N distinct names are acquired and released once each (an ``AsyncLock`` each,
defaults, ttl 1 s; a few processes running asyncio tasks, for throughput). Measured
with ``INFO memory`` ``used_memory``, over the fresh server's own:

* right after the last release;
* at the bound, ``redlease._rules.keys.forgotten_within(ttl_ms)`` after the last release: by
  then every key redlease wrote for a name has expired;
* after the bound, polling ``DBSIZE`` and ``used_memory`` for a while longer: the server
  drops an expired key when something touches it or when its active expiry cycle
  (sampling keys ten times a second) finds it, so keys past their TTL still count for a
  moment. ``DBSIZE`` is polled from the last release on, and the figure is how long it
  took to reach 0.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis

import redlease
from redlease.tools import servers

from ._common import FULL, Crew, Settings, describe_error, sleep_until
from ._report import NA, Row, verdict

SECTION = "9. memory: server memory kept for lock names taken once each"
CONTENDER = "redlease AsyncLock (defaults, ttl 1 s)"
TTL = 1.0  # short, so the bound (a few ttls) is short
MB = 1_000_000
# The bar after the bound. DBSIZE 0 is the exact part: no key is left for any name. This
# margin is for what is not keys: the scripts loaded and their Lua state, the allocator's
# rounding (0.2-0.3 MB here, whatever the number of names). It is about a byte per name
# at 1,000,000 names, so tables the server failed to shrink (over 8 MB for a million
# keys) would still exceed it; 1,000,000 keys that expired came back to +0.1 MB here.
TOLERANCE = 1 * MB
POLL = 0.1  # seconds between DBSIZE/used_memory reads after the bound
LOAD_LIMIT = 600.0  # seconds for the workers to take every name
PREFIX = "orders:"


def _bound_ms() -> Callable[[int], int] | None:
    """``redlease._rules.keys.forgotten_within``: the one place the bound is defined (None if
    this redlease has none)."""
    try:
        from redlease._rules.keys import forgotten_within
    except ImportError:
        return None
    return forgotten_within


# -- the workers (crew processes) -------------------------------------------------------


def load(port: int, first: int, stop: int, tasks: int, start: float) -> dict[str, Any]:
    """Acquire and release ``orders:<first>`` .. ``orders:<stop - 1>`` once each, on
    ``tasks`` asyncio tasks; returns when every grant is given back on the server."""
    return asyncio.run(_load(port, range(first, stop), tasks, start))


async def _load(port: int, numbers: range, tasks: int, start: float) -> dict[str, Any]:
    client = aredis.Redis(host="127.0.0.1", port=port)
    try:
        await client.ping()
        names = iter(numbers)  # shared: each task takes the next free number
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        began = time.monotonic()

        async def one() -> None:
            for n in names:
                name = f"{PREFIX}{n}"
                lease = await redlease.AsyncLock(client, name, ttl=TTL).acquire(timeout=30.0)
                await lease.release()  # given back on the server when it returns

        await asyncio.gather(*(one() for _ in range(tasks)))
        return {"names": len(numbers), "began": began, "last_release": time.monotonic()}
    finally:
        await client.aclose()


# -- the measurement --------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    at: float  # time.monotonic()
    used: int  # INFO memory used_memory, bytes
    keys: int  # DBSIZE
    expiring: int  # of which with a TTL (INFO keyspace)


def snapshot(admin: redis.Redis) -> Snapshot:
    at = time.monotonic()  # before the reads: a reading taken at or after ``at``
    used = int(admin.info("memory")["used_memory"])
    db0 = admin.info("keyspace").get("db0", {})
    return Snapshot(at, used, int(admin.dbsize()), int(db0.get("expires", 0)))


@dataclass
class Tally:
    names: int
    baseline: Snapshot | None = None
    at_once: Snapshot | None = None
    at_bound: Snapshot | None = None
    final: Snapshot | None = None
    bound_ms: int | None = None
    last_release: float = float("nan")
    emptied: float | None = None  # seconds from the last release to DBSIZE 0
    load_seconds: float = float("nan")
    problem: str | None = None


def measure(server_kind: str, settings: Settings) -> Tally:
    tally = Tally(settings.memory_names)
    try:
        with servers.running(1, kind=server_kind) as fresh:
            port = fresh[0].port
            with redis.Redis(host="127.0.0.1", port=port) as admin:
                _measure(tally, admin, port, settings)
    except Exception as exc:
        tally.problem = f"error: {describe_error(exc)}"
    return tally


def _measure(tally: Tally, admin: redis.Redis, port: int, settings: Settings) -> None:
    tally.baseline = snapshot(admin)
    processes = max(1, min(settings.memory_processes, tally.names))
    shares = [tally.names * k // processes for k in range(processes + 1)]
    with Crew(processes) as crew:
        start = time.monotonic() + settings.start_margin
        calls = [
            (port, shares[k], shares[k + 1], settings.memory_tasks, start) for k in range(processes)
        ]
        done = crew.map_all(load, calls, timeout=LOAD_LIMIT)
        tally.at_once = snapshot(admin)
    # the crew is gone, and its connections with it: from here on only keys differ
    tally.last_release = max(d["last_release"] for d in done)
    tally.load_seconds = tally.last_release - min(d["began"] for d in done)
    forgotten_within = _bound_ms()
    if forgotten_within is None:
        tally.problem = "n/a (redlease._rules.keys.forgotten_within not found)"
        return
    tally.bound_ms = forgotten_within(round(TTL * 1000))
    bound_at = tally.last_release + tally.bound_ms / 1000
    deadline = bound_at + settings.memory_grace
    # Polled from now, not from the bound: DBSIZE may reach 0 before it.
    now = snapshot(admin)
    while True:
        if now.keys == 0 and tally.emptied is None:
            tally.emptied = now.at - tally.last_release
        if tally.at_bound is None and now.at >= bound_at:
            tally.at_bound = now
        if tally.at_bound is not None:
            settled = now.keys == 0 and now.used - tally.baseline.used <= TOLERANCE
            # keys left without a TTL never expire: nothing more to wait for
            if settled or (now.keys and not now.expiring) or now.at >= deadline:
                break
        wake = time.monotonic() + POLL
        sleep_until(wake if tally.at_bound is not None else min(wake, bound_at))
        now = snapshot(admin)
    tally.final = now


# -- the rows ---------------------------------------------------------------------------


def _grown(s: Snapshot, baseline: Snapshot, names: int) -> tuple[float, str, str, dict[str, Any]]:
    """(MB over the baseline, as shown, bytes per name, JSON details) of one reading."""
    grown = s.used - baseline.used
    keys = f"DBSIZE {s.keys:,}"
    if s.keys and not s.expiring:
        keys += ", none with a TTL"
    extra = {"used_memory": s.used, "bytes": grown, "dbsize": s.keys, "expiring": s.expiring}
    return grown / MB, f"{grown / MB:+.2f} MB ({keys})", f"{grown / names:.1f} B/name", extra


def rows(tally: Tally, settings: Settings) -> list[Row]:
    names = tally.names
    out: list[Row] = []

    def row(figure: str, shown: str, **more: Any) -> None:
        out.append(Row(SECTION, CONTENDER, figure, more.pop("value", None), shown, **more))

    after_bound = f"memory after the bound (then up to {settings.memory_grace:g} s more)"
    base = tally.baseline
    if base is not None:
        row(
            "used_memory of the fresh server (baseline)",
            f"{base.used / MB:.2f} MB",
            value=base.used / MB,
        )
    if tally.at_once is None or base is None:
        row(f"memory after {names:,} names (once each)", tally.problem or "error", verdict=NA)
        return out
    value, shown, per_name, extra = _grown(tally.at_once, base, names)
    extra["load_seconds"] = round(tally.load_seconds, 1)
    extra["names_per_second"] = round(names / tally.load_seconds)
    row(
        f"memory after {names:,} names (once each), at once",
        shown,
        value=value,
        ratio=per_name,
        extra=extra,
    )
    if tally.bound_ms is None or tally.at_bound is None or tally.final is None:
        row(after_bound, tally.problem or "error", verdict=NA)
        return out
    bound = tally.bound_ms / 1000
    value, shown, per_name, extra = _grown(tally.at_bound, base, names)
    extra["bound_ms"] = tally.bound_ms
    row(
        f"memory at the bound ({bound:.1f} s after the last release)",
        shown,
        value=value,
        ratio=per_name,
        extra=extra,
    )
    final = tally.final
    value, shown, per_name, extra = _grown(final, base, names)
    extra["seconds_after_release"] = round(final.at - tally.last_release, 2)
    ok = final.keys == 0 and final.used - base.used <= TOLERANCE
    row(
        after_bound,
        shown,
        value=value,
        ratio=per_name,
        bar=f"<= +{TOLERANCE / MB:g} MB and DBSIZE 0",
        verdict=verdict(ok),
        extra=extra,
    )
    waited = final.at - tally.last_release
    if tally.emptied is not None:
        shown = f"{tally.emptied:.1f} s after the last release"
    elif final.keys and not final.expiring:
        shown = f"never: {final.keys:,} keys without a TTL (waited {waited:.1f} s)"
    else:
        shown = f"not within {waited:.1f} s of the last release (DBSIZE {final.keys:,})"
    row("DBSIZE reached 0", shown, value=tally.emptied)
    return out


def run(server_kind: str, settings: Settings) -> list[Row]:
    return rows(measure(server_kind, settings), settings)


def note(settings: Settings) -> str:
    names = settings.memory_names
    fewer = f" (not {FULL.memory_names:,}: a shorter run)" if names < FULL.memory_names else ""
    return (
        f"memory: {names:,} names{fewer}, each acquired and released once by "
        f"{settings.memory_processes} process(es) x {settings.memory_tasks} asyncio tasks on a "
        f"fresh server; used_memory (INFO memory) over that server's own; the bound is "
        f"redlease._rules.keys.forgotten_within(ttl_ms); DBSIZE is polled every {POLL:g} s from "
        f"the last release until up to {settings.memory_grace:g} s past the bound (expired "
        "keys are dropped by the server's active expiry cycle, which samples keys)."
    )
