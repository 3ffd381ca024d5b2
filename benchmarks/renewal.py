"""Section 6: keeping many leases alive in one process (auto-renewal).

In a fresh process, N locks with a ttl of a few seconds are acquired with auto-renewal
on and held for a while. Measured over the holding window:

* extra threads: the process's peak OS thread count minus its count before the locks
  existed;
* CPU share: ``time.process_time()`` (all threads) over wall time, in % of one core;
* round trips: writes to the server (``sendall`` calls on the connections' sockets,
  counted by a socket subclass; a pipelined batch is one write), per second;
* renewals: ``EVALSHA``/``EVAL`` calls seen by the server (``INFO commandstats``);
* leases still held at the end (each key still carries its holder's token).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from ._common import Settings, calls_between, command_calls, describe_error, os_threads, run_alone
from ._report import NA, Row, verdict

SECTION = "6. auto-renewal: many leases held in one process"
SAMPLE_EVERY = 0.25


class _CountingSocket(socket.socket):
    """A socket that counts its writes (one per round trip or pipelined batch)."""

    writes = 0
    _lock = threading.Lock()

    def sendall(self, data: Any, flags: int = 0) -> None:
        with _CountingSocket._lock:
            _CountingSocket.writes += 1
        super().sendall(data, flags)


class CountingConnection(redis.Connection):
    """A redis-py connection whose socket counts writes, whichever path writes to it
    (redis-py's command path, or a driver writing to the socket directly)."""

    def _connect(self) -> socket.socket:
        sock: socket.socket = super()._connect()  # type: ignore[no-untyped-call]
        counted = _CountingSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
        counted.settimeout(self.socket_timeout)
        return counted


def _acquire_redlease(r: redis.Redis, count: int, ttl: float) -> list[tuple[str, str, Any]]:
    import redlease
    from redlease._rules.keys import LockKeys

    held = []
    for i in range(count):
        name = f"bench:r:redlease:{i}"
        lease = redlease.Lock(r, name, ttl=ttl, auto_renew=True).acquire(timeout=10.0)
        # (the key layout is the library's: see src/redlease/_keys.py)
        held.append((LockKeys.for_name(name).lock, lease.token, lease))
    return held


def _acquire_prl(r: redis.Redis, count: int, ttl: float) -> list[tuple[str, str, Any]]:
    import redis_lock

    held = []
    for i in range(count):
        name = f"bench:r:prl:{i}"
        lock = redis_lock.Lock(r, name, expire=max(1, round(ttl)), auto_renewal=True)
        if not lock.acquire(timeout=10):
            raise RuntimeError("python-redis-lock: not acquired")
        held.append((f"lock:{name}", lock.id, lock))
    return held


def hold_many(kind: str, port: int, count: int, ttl: float, hold: float) -> dict[str, Any]:
    """Runs in a fresh process: acquire ``count`` auto-renewed locks, hold, measure."""
    observer = redis.Redis(host="127.0.0.1", port=port)
    # Room for every lock's renewal at once: python-redis-lock's renewal threads all wake
    # together, and redis-py's default pool (100 connections) then refuses some of them
    # (MaxConnectionsError kills that lock's renewal thread and the lock expires).
    pool = redis.ConnectionPool(
        host="127.0.0.1",
        port=port,
        connection_class=CountingConnection,
        max_connections=count + 100,
    )
    r = redis.Redis(connection_pool=pool)
    r.ping()
    threads_before = os_threads()
    try:
        if kind == "redlease":
            held = _acquire_redlease(r, count, ttl)
        else:
            held = _acquire_prl(r, count, ttl)
    except NotImplementedError as exc:
        return {"unavailable": str(exc) or "auto_renew not implemented yet"}
    calls_before = command_calls(observer)
    writes_before = _CountingSocket.writes
    cpu_before, opened = time.process_time(), time.monotonic()
    peak = os_threads()
    while time.monotonic() - opened < hold:
        time.sleep(SAMPLE_EVERY)
        peak = max(peak, os_threads())
    cpu, window = time.process_time() - cpu_before, time.monotonic() - opened
    writes = _CountingSocket.writes - writes_before
    calls = calls_between(calls_before, command_calls(observer))
    pipe = observer.pipeline(transaction=False)
    for key, _, _ in held:
        pipe.get(key)
    values = pipe.execute()
    still_held = sum(
        1
        for (_, token, _), value in zip(held, values, strict=True)
        if value is not None and value.decode() == token
    )
    for _, _, handle in held:
        with contextlib.suppress(Exception):  # a lease lost is counted above
            handle.release()
    # A renewal is an FCALL (Redis 7+, Valkey), or an EVALSHA; a script's first use on a
    # server goes as EVAL, and an EVALSHA answered NOSCRIPT or an FCALL answered "not
    # found" is sent again: count each renewal once.
    fallbacks = calls.get("eval", 0)
    renewals = (
        calls.get("fcall", 0)
        - calls.get("fcall:failed", 0)
        + calls.get("evalsha", 0)
        - calls.get("evalsha:failed", 0)
        + fallbacks
    )
    return {
        "count": count,
        "extra_threads": peak - threads_before,
        "cpu_share": cpu / window,
        "round_trips_per_s": writes / window,
        "renewals_per_s": renewals / window,
        "renewals_per_lease_per_s": renewals / window / count,
        "renewals_per_round_trip": renewals / writes if writes else float("nan"),
        "still_held": still_held,
        "noscript_fallbacks": fallbacks,
        "window": window,
        "commands": calls,
    }


@dataclass
class Tally:
    kind: str
    label: str
    result: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None


def measure(port: int, settings: Settings, *, fresh_process: bool = True) -> list[Tally]:
    """``fresh_process=False`` runs in this process (thread counts then include its own)."""
    plan = [
        ("redlease", f"redlease Lock, {settings.leases:,} leases", settings.leases),
        (
            "python-redis-lock",
            f"python-redis-lock, {settings.peer_leases:,} locks (thread per lock)",
            settings.peer_leases,
        ),
    ]
    tallies = []
    for kind, label, count in plan:
        tally = Tally(kind, label)
        try:
            call = (kind, port, count, settings.renewal_ttl, settings.renewal_hold)
            got = run_alone(hold_many, *call) if fresh_process else hold_many(*call)
            if "unavailable" in got:
                tally.problem = f"{NA} ({got['unavailable']})"
            else:
                tally.result = got
        except Exception as exc:
            tally.problem = f"error: {describe_error(exc)}"
        tallies.append(tally)
    return tallies


def rows(tallies: list[Tally], settings: Settings) -> list[Row]:
    out = []
    for t in tallies:
        mine = t.kind == "redlease"
        label = f"{t.label}, ttl {settings.renewal_ttl:g} s"
        if t.problem is not None:
            out.append(
                Row(
                    SECTION,
                    label,
                    "extra threads",
                    None,
                    t.problem,
                    bar="<= 2" if mine else "",
                    verdict=NA if mine else "",
                )
            )
            continue
        g = t.result
        out.append(
            Row(
                SECTION,
                label,
                "extra threads",
                g["extra_threads"],
                str(g["extra_threads"]),
                bar="<= 2" if mine else "",
                verdict=verdict(g["extra_threads"] <= 2) if mine else "",
            )
        )
        cpu = g["cpu_share"]
        out.append(
            Row(
                SECTION,
                label,
                "CPU, % of one core",
                cpu,
                f"{cpu * 100:.1f}%",
                bar="< 15%" if mine else "",
                verdict=verdict(cpu < 0.15) if mine else "",
            )
        )
        out.append(
            Row(
                SECTION,
                label,
                "round trips/s",
                g["round_trips_per_s"],
                f"{g['round_trips_per_s']:,.1f}",
            )
        )
        out.append(
            Row(
                SECTION,
                label,
                "EVAL calls (a script's first use, or NOSCRIPT)",
                g["noscript_fallbacks"],
                f"{g['noscript_fallbacks']:,}",
            )
        )
        per_trip = g["renewals_per_round_trip"]
        out.append(
            Row(
                SECTION,
                label,
                "renewals per round trip",
                per_trip,
                f"{per_trip:,.1f}",
                bar="batched (> 1)" if mine else "",
                verdict=verdict(per_trip > 1) if mine else "",
            )
        )
        out.append(
            Row(
                SECTION,
                label,
                "renewals per lease per s",
                g["renewals_per_lease_per_s"],
                f"{g['renewals_per_lease_per_s']:.2f}",
            )
        )
        lost = g["count"] - g["still_held"]
        out.append(
            Row(
                SECTION,
                label,
                "leases lost",
                float(lost),
                f"{lost} of {g['count']:,}",
                bar="0",
                verdict=verdict(lost == 0),
                extra={"commands": g["commands"]},
            )
        )
    return out


def run(port: int, settings: Settings, *, fresh_process: bool = True) -> list[Row]:
    return rows(measure(port, settings, fresh_process=fresh_process), settings)
