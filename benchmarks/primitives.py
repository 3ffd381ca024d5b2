"""Sections 10 to 12: the primitives beyond the lock, each beside the lock in one run.

10. A semaphore of limit 4 with N processes: each holds a permit for a moment (a fixed
    sleep, as a job would) and counts its sections; sections/s, waits and fairness,
    beside the lock on the same work (which lets one in at a time).
11. Readers and writers, 9:1, N processes: the same sections under a read/write lock
    and under a lock; read sections/s of each.
12. Election failover: from ``resign()`` to the next candidate leading (both in this
    process, each on its own client), and from killing the leader's process (-9) to
    the next candidate leading, against the ttl and a round trip.
The uncontended cycles of a permit, a read lease and a write lease are in section 1,
measured in the same rounds as the lock's.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

import redlease

from ._common import Crew, Settings, describe_error, median, percentile, sleep_until, together
from ._report import Row, ms, rate, times, verdict

TTL = 10.0
LIMIT = 4
HOLD = 0.002  # seconds a section holds its permit or lease
WRITES = 0.1  # the share of writers in section 11


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port)


# -- 10 and 11: processes ------------------------------------------------------------------


def worker(kind: str, port: int, name: str, start: float, end: float, seed: int) -> dict[str, Any]:
    """One process of sections 10 and 11 (runs in a crew process)."""
    r = _client(port)
    r.ping()
    rng = random.Random(seed)
    sem = redlease.Semaphore(r, name, LIMIT, ttl=TTL)
    rw = redlease.ReadWriteLock(r, name, ttl=TTL)
    lock = redlease.Lock(r, name, ttl=TTL)
    waits: list[float] = []
    reads = 0
    on_time = sleep_until(start)
    while True:
        asked = time.monotonic()
        if asked >= end:
            break
        writing = rng.random() < WRITES
        if kind == "semaphore":
            held: Any = sem.acquire(timeout=60)
        elif kind == "rw":
            held = (rw.write if writing else rw.read).acquire(timeout=60)
        else:
            held = lock.acquire(timeout=60)
        waits.append(time.monotonic() - asked)
        time.sleep(HOLD)
        held.release()
        reads += not writing
    r.close()
    done = time.monotonic()
    return {
        "sections": len(waits),
        "reads": reads,
        "waits": waits,
        "done": done,
        "on_time": on_time,
    }


def _round(crew: Crew, kind: str, port: int, settings: Settings, tag: str) -> dict[str, Any]:
    seconds = settings.contention_seconds

    def calls(start: float) -> list[tuple[Any, ...]]:
        return [
            (kind, port, f"bench:p:{tag}", start, start + seconds, i)
            for i in range(settings.processes)
        ]

    start, results = together(crew, worker, calls, settings.start_margin, seconds)
    finished = max(res["done"] for res in results)
    sections = [res["sections"] for res in results]
    return {
        "rate": sum(sections) / (finished - start),
        "reads": sum(res["reads"] for res in results) / (finished - start),
        "fairness": min(sections) / max(sections) if max(sections) else 0.0,
        "waits": [w for res in results for w in res["waits"]],
    }


def _processes(crew: Crew, port: int, settings: Settings, pair: Sequence[str]) -> dict[str, Any]:
    """Rounds of each kind in ``pair``, alternating; per kind the medians and waits."""
    got: dict[str, dict[str, Any]] = {
        k: {"rate": [], "reads": [], "fair": [], "waits": []} for k in pair
    }
    for round_no in range(settings.contention_rounds):
        for kind in pair if round_no % 2 == 0 else pair[::-1]:
            one = _round(crew, kind, port, settings, f"{kind}:{round_no}")
            got[kind]["rate"].append(one["rate"])
            got[kind]["reads"].append(one["reads"])
            got[kind]["fair"].append(one["fairness"])
            got[kind]["waits"].extend(one["waits"])
    return got


def _semaphore_rows(got: dict[str, Any], processes: int) -> list[Row]:
    section = f"10. Semaphore(limit={LIMIT}), {processes} processes, {HOLD * 1000:g} ms sections"
    out = []
    lock_rate = median(got["lock"]["rate"])
    for kind, label in (
        ("semaphore", f"redlease Semaphore, limit {LIMIT}"),
        ("lock", "redlease Lock"),
    ):
        mine = got[kind]
        value = median(mine["rate"])
        out.append(
            Row(
                section,
                label,
                "sections/s",
                value,
                rate(value),
                ratio=times(value / lock_rate, "Lock") if kind == "semaphore" else "",
                extra={"rounds": [round(x, 1) for x in mine["rate"]]},
            )
        )
        p99 = percentile(mine["waits"], 99)
        out.append(Row(section, label, "wait p99", p99, ms(p99)))
        fair = median(mine["fair"])
        out.append(Row(section, label, "fairness (fewest/most)", fair, f"{fair:.2f}"))
    return out


def _read_write_rows(got: dict[str, Any], processes: int) -> list[Row]:
    section = (
        f"11. readers and writers {round((1 - WRITES) * 10)}:{round(WRITES * 10)}, "
        f"{processes} processes, {HOLD * 1000:g} ms sections"
    )
    lock_reads = median(got["lock"]["reads"])
    out = []
    for kind, label in (
        ("rw", "redlease ReadWriteLock"),
        ("lock", "redlease Lock (all exclusive)"),
    ):
        value = median(got[kind]["reads"])
        out.append(
            Row(
                section,
                label,
                "read sections/s",
                value,
                rate(value),
                ratio=times(value / lock_reads, "Lock") if kind == "rw" else "",
                extra={"rounds": [round(x, 1) for x in got[kind]["reads"]]},
            )
        )
        p99 = percentile(got[kind]["waits"], 99)
        out.append(Row(section, label, "wait p99", p99, ms(p99)))
    return out


# -- 12: election failover -------------------------------------------------------------------

_LEADER = """
import sys, time, redis, redlease
port, name, ttl = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
redlease.Election(redis.Redis(port=port), name, ttl=ttl).campaign()
print("leading", flush=True)
time.sleep(600)
"""


def _campaigning(
    candidate: redlease.Election, timeout: float
) -> tuple[threading.Thread, list[float]]:
    """``candidate.campaign()`` in a thread; the list gets when it led (perf_counter)."""
    led: list[float] = []

    def campaign() -> None:
        candidate.campaign(timeout=timeout)
        led.append(time.perf_counter())

    thread = threading.Thread(target=campaign)
    thread.start()
    return thread, led


def _after_resign(port: int, reps: int) -> list[float]:
    """Seconds from ``resign()`` to the waiting candidate leading, ``reps`` times."""
    name = f"bench:e:resign:{os.getpid()}"
    a = redlease.Election(_client(port), name, ttl=TTL, identity="a")
    b = redlease.Election(_client(port), name, ttl=TTL, identity="b")
    probe = _client(port)
    queue = f"redlease:{{{name}}}:elect:queue"
    times_taken: list[float] = []
    leader, other = a, b
    leader.campaign(timeout=10)
    for _ in range(reps):
        thread, led = _campaigning(other, 30)
        deadline = time.monotonic() + 10
        while not probe.llen(queue) and time.monotonic() < deadline:
            time.sleep(0.001)
        resigned = time.perf_counter()
        leader.resign()
        thread.join(30)
        times_taken.append(led[0] - resigned)
        leader, other = other, leader
    leader.resign()
    probe.close()
    return times_taken


def _after_kill(port: int, reps: int, ttl: float) -> list[float]:
    """Seconds from killing the leader's process to the next candidate leading."""
    out: list[float] = []
    for rep in range(reps):
        name = f"bench:e:kill:{os.getpid()}:{rep}"
        leader = subprocess.Popen(
            [sys.executable, "-c", _LEADER, str(port), name, str(ttl)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert leader.stdout is not None
            leader.stdout.readline()
            heir = redlease.Election(_client(port), name, ttl=ttl, identity="heir")
            thread, led = _campaigning(heir, 60)
            time.sleep(ttl / 2)  # the heir waits; the leader renews meanwhile
            killed = time.perf_counter()
            leader.send_signal(signal.SIGKILL)
            thread.join(60)
            out.append(led[0] - killed)
            heir.resign()
        finally:
            leader.kill()
            leader.wait(30)
            if leader.stdout is not None:
                leader.stdout.close()
    return out


_TOOZ_LEADER = """
import sys, time
from tooz import coordination
port, group, ttl = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]
url = f"redis://127.0.0.1:{port}?lock_timeout={ttl}&membership_timeout={ttl}"
c = coordination.get_coordinator(url, b"leader")
c.start(start_heart=True)
try:
    c.create_group(group).get()
except coordination.GroupAlreadyExist:
    pass
c.join_group(group).get()
led = []
c.watch_elected_as_leader(group, lambda event: led.append(1))
while not led:
    c.run_watchers()
    time.sleep(0.01)
print("leading", flush=True)
time.sleep(600)
"""
TOOZ_POLL = 0.1  # how often the tooz candidate runs its watchers (it polls for leadership)


def _timer(times: list[float]) -> Any:
    """A tooz election callback that notes when it ran (a function: tooz wants a name)."""

    def elected(event: Any) -> None:
        times.append(time.perf_counter())

    return elected


def _tooz_after_kill(port: int, reps: int, ttl: int) -> list[float]:
    """tooz's Redis driver: a candidate polling ``run_watchers()`` every TOOZ_POLL s."""
    from tooz import coordination

    out: list[float] = []
    for rep in range(reps):
        group = f"bench-e-{os.getpid()}-{rep}"
        leader = subprocess.Popen(
            [sys.executable, "-c", _TOOZ_LEADER, str(port), group, str(ttl)],
            stdout=subprocess.PIPE,
            text=True,
        )
        url = f"redis://127.0.0.1:{port}?lock_timeout={ttl}&membership_timeout={ttl}"
        heir = coordination.get_coordinator(url, b"heir")
        try:
            assert leader.stdout is not None
            leader.stdout.readline()
            heir.start(start_heart=True)
            heir.join_group(group.encode()).get()
            led: list[float] = []
            heir.watch_elected_as_leader(group.encode(), _timer(led))
            heir.run_watchers()
            killed = time.perf_counter()
            leader.send_signal(signal.SIGKILL)
            deadline = killed + ttl + 30
            while not led and time.perf_counter() < deadline:
                time.sleep(TOOZ_POLL)
                heir.run_watchers()
            out.append(led[0] - killed if led else float("nan"))
        finally:
            heir.stop()
            leader.kill()
            leader.wait(30)
            if leader.stdout is not None:
                leader.stdout.close()
    return out


def _round_trip(port: int) -> float:
    r = _client(port)
    samples = []
    for _ in range(200):
        t = time.perf_counter()
        r.ping()
        samples.append(time.perf_counter() - t)
    r.close()
    return median(samples)


def _election_rows(port: int, settings: Settings) -> list[Row]:
    section = "12. Election failover"
    out: list[Row] = []
    resigns = _after_resign(port, max(5, settings.handoff_reps))
    p50 = median(resigns)
    out.append(
        Row(
            section,
            "redlease Election",
            f"new leader after resign(), p50 of {len(resigns)}",
            p50,
            ms(p50),
            bar="<= 5 ms",
            verdict=verdict(p50 <= 0.005),
        )
    )
    ttl = 0.5
    kills = _after_kill(port, max(2, settings.handoff_rounds), ttl)
    rtt = _round_trip(port)
    worst = max(kills)
    out.append(
        Row(
            section,
            "redlease Election",
            f"new leader after the leader is killed (-9), worst of {len(kills)}, ttl {ttl:g} s",
            worst,
            ms(worst),
            bar=f"<= ttl + 1 round trip ({ms(ttl + rtt)})",
            verdict=verdict(worst <= ttl + rtt),
        )
    )
    # beside tooz, with the 1 s that is its shortest lock timeout (whole seconds)
    mine = _after_kill(port, max(2, settings.handoff_rounds // 2), 1.0)
    out.append(
        Row(
            section,
            "redlease Election",
            f"new leader after the leader is killed (-9), median of {len(mine)}, ttl 1 s",
            median(mine),
            ms(median(mine)),
        )
    )
    try:
        theirs = _tooz_after_kill(port, max(2, settings.handoff_rounds // 2), 1)
    except ImportError:
        out.append(Row(section, "tooz (Redis driver)", "n/a", None, "n/a (tooz not installed)"))
    else:
        out.append(
            Row(
                section,
                f"tooz (Redis driver), polling every {TOOZ_POLL:g} s",
                f"new leader after the leader is killed (-9), median of {len(theirs)}, "
                "lock_timeout 1 s",
                median(theirs),
                ms(median(theirs)),
                ratio=times(median(theirs) / median(mine), "redlease"),
            )
        )
        out.append(
            Row(
                section,
                f"tooz (Redis driver), polling every {TOOZ_POLL:g} s",
                "new leader after resign()",
                None,
                "n/a (its Redis driver does not implement stand_down_group_leader)",
            )
        )
    return out


def run(crew: Crew, port: int, settings: Settings) -> list[Row]:
    out: list[Row] = []
    for pair, make_rows in (
        (("semaphore", "lock"), _semaphore_rows),
        (("rw", "lock"), _read_write_rows),
    ):
        try:
            out.extend(make_rows(_processes(crew, port, settings, pair), settings.processes))
        except Exception as exc:
            out.append(
                Row(f"{pair[0]}", "redlease", "error", None, f"error: {describe_error(exc)}")
            )
    try:
        out.extend(_election_rows(port, settings))
    except Exception as exc:
        out.append(
            Row("12. Election failover", "redlease", "error", None, f"error: {describe_error(exc)}")
        )
    return out
