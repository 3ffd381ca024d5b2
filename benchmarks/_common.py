"""Shared pieces: run settings, statistics, server counters and the crew of worker
processes that the multi-process figures run on."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis


@dataclass(frozen=True)
class Settings:
    """How long and how often each figure is measured."""

    # uncontended cycles (sections 1 and 2): interleaved rounds, seconds per contender each
    rounds: int = 40
    round_seconds: float = 0.05
    # contention (section 3)
    processes: int = 8
    start_margin: float = 0.5  # from handing out work to the common start
    contention_rounds: int = 4
    contention_seconds: float = 1.5
    # handoff (section 4): rounds x repetitions per round, per contender
    handoff_rounds: int = 4
    handoff_reps: int = 20
    handoff_hold: float = 0.015  # the shortest hold; a random 0..handoff_spread is added
    handoff_spread: float = 0.1  # one poll interval of redis-py's Lock
    # idle waiters (section 5)
    idle_waiters: int = 8
    idle_seconds: float = 5.0
    idle_settle: float = 0.7  # for the waiters to start and block before the window
    # auto-renewal (section 6)
    leases: int = 3000
    peer_leases: int = 300
    renewal_ttl: float = 3.0
    renewal_hold: float = 10.0
    # timed-out acquires (section 7), per contender
    timed_out_asks: int = 100
    # blocked waiters in one process (section 8): asyncio tasks, and threads
    waiting_tasks: tuple[int, ...] = (10, 1000, 10000)
    waiting_threads: tuple[int, ...] = (10, 1000)
    # memory kept for names taken once (section 9): the names, and the processes x asyncio
    # tasks taking them (fewer tasks than the 128 connections redlease's asyncio pool keeps)
    memory_names: int = 1_000_000
    memory_processes: int = 2
    memory_tasks: int = 32
    memory_grace: float = 30.0  # after the bound, for the server's active expiry
    # CPU per gated transaction (section 13): chunks per side, transactions per chunk
    cpu_chunks: int = 4
    cpu_cycles: int = 3000
    # the server's share (section 15): rounds (a fresh server each), seconds per figure,
    # uncontended processes (a name each), contending processes (one name)
    share_rounds: int = 6
    share_seconds: float = 1.0
    share_processes: int = 2
    share_contenders: int = 4
    # a burst (section 16): rounds (fresh processes), held names, asyncio waiters
    burst_rounds: int = 3
    burst_names: int = 200
    burst_tasks: int = 2000


FULL = Settings()
QUICK = Settings(
    rounds=15,
    round_seconds=0.04,
    contention_rounds=2,
    contention_seconds=1.0,
    handoff_rounds=2,
    handoff_reps=15,
    idle_seconds=2.0,
    renewal_hold=4.0,
    timed_out_asks=50,
    waiting_tasks=(10, 1000),
    waiting_threads=(10, 300),
    memory_names=100_000,
    cpu_chunks=2,
    cpu_cycles=1500,
    share_rounds=3,
    share_seconds=0.6,
    burst_rounds=2,
)
# For the smoke test: every code path, no meaningful figures.
TINY = Settings(
    rounds=1,
    round_seconds=0.02,
    processes=3,
    start_margin=0.2,
    contention_rounds=1,
    contention_seconds=0.3,
    handoff_rounds=1,
    handoff_reps=5,
    handoff_spread=0.02,
    idle_waiters=2,
    idle_seconds=0.3,
    idle_settle=0.3,
    leases=50,
    peer_leases=5,
    renewal_ttl=0.9,
    renewal_hold=0.5,
    timed_out_asks=5,
    waiting_tasks=(5,),
    waiting_threads=(5,),
    memory_names=1000,
    memory_processes=1,
    memory_tasks=4,
    memory_grace=1.0,
    cpu_chunks=1,
    cpu_cycles=20,
    share_rounds=1,
    share_seconds=0.2,
    share_contenders=2,
    burst_rounds=1,
    burst_names=5,
    burst_tasks=40,
)


# -- statistics -------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), nearest rank on the sorted values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


# -- server counters --------------------------------------------------------------------

# Commands that only the benchmark itself sends while it watches the server.
OBSERVER_COMMANDS = frozenset({"info"})
# What a client sends once when it opens a connection (not part of waiting or renewing).
HANDSHAKE_COMMANDS = frozenset({"hello", "client|setinfo", "client|setname", "auth", "select"})
FAILED = ":failed"  # suffix of the failed-call counts in a ``command_calls`` snapshot


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Calls per command so far (``INFO commandstats``), e.g. ``{"blpop": 12}``; failed
    calls (an ``EVALSHA`` answered NOSCRIPT...) also appear as ``"evalsha:failed"``."""
    stats: Mapping[str, Any] = client.info("commandstats")
    calls: dict[str, int] = {}
    for key, value in stats.items():
        name = key.removeprefix("cmdstat_")
        if isinstance(value, Mapping):
            calls[name] = int(value.get("calls", 0))
            calls[name + FAILED] = int(value.get("failed_calls", 0))
    return calls


def server_cpu(client: redis.Redis) -> float:
    """Seconds of CPU the server process has used (``INFO cpu``, user + system). Per
    section it is the fair measure of server work: ``INFO commandstats`` counts the time
    of a script's inner commands twice (in their own line and in the script's)."""
    cpu: Mapping[str, Any] = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def calls_between(
    before: Mapping[str, int], after: Mapping[str, int], *, handshakes: bool = True
) -> dict[str, int]:
    """Commands counted between two ``command_calls`` snapshots, without the observer's
    (and without connection handshakes if ``handshakes`` is false)."""
    delta: dict[str, int] = {}
    for name, count in after.items():
        if name in OBSERVER_COMMANDS or (not handshakes and name in HANDSHAKE_COMMANDS):
            continue
        grew = count - before.get(name, 0)
        if grew:
            delta[name] = grew
    return delta


def server_version(client: redis.Redis) -> str:
    info: Mapping[str, Any] = client.info("server")
    for key in ("valkey_version", "redis_version"):
        if key in info:
            return str(info[key])
    return "unknown"


def os_threads() -> int:
    """Threads of this process as the OS sees them (Python's and any others)."""
    try:
        with open(f"/proc/{os.getpid()}/status") as status:
            for line in status:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import threading

    return threading.active_count()


def sleep_until(when: float) -> bool:
    """Sleep until ``when``; whether it was still ahead (False: the caller is late)."""
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    return delay > 0


# -- the crew: worker processes ---------------------------------------------------------


def _warm_up() -> None:
    # Import what the workers use before any figure is timed.
    import pottery  # noqa: F401
    import redis_lock  # noqa: F401

    import redlease

    _ = redlease.Lock  # (import redlease loads the library on first use: now)


def _report_pid(hold: float) -> int:
    time.sleep(hold)
    return os.getpid()


class Crew:
    """A fixed set of spawned worker processes, reused by every multi-process figure.

    ``run_together`` gives each call its own process: every call blocks until a shared
    start time, so no process can take a second call while another is still idle.
    ``time.monotonic()`` is system-wide on Linux (CLOCK_MONOTONIC), so times taken in
    different processes compare directly.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        context = multiprocessing.get_context("spawn")
        self._pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=size, mp_context=context, initializer=_warm_up
        )
        for _ in range(3):
            pids = set(self.map_all(_report_pid, [(0.3,)] * size))
            if len(pids) == size:
                break

    def map_all(
        self, fn: Callable[..., Any], calls: Iterable[tuple[Any, ...]], timeout: float = 120.0
    ) -> list[Any]:
        futures = [self._pool.submit(fn, *call) for call in calls]
        done = []
        deadline = time.monotonic() + timeout
        for future in futures:
            done.append(future.result(timeout=max(0.1, deadline - time.monotonic())))
        return done

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        return self._pool.submit(fn, *args)

    def close(self, *, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)

    def __enter__(self) -> Crew:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close(wait=exc_type is None)


def together(
    crew: Crew,
    fn: Callable[..., dict[str, Any]],
    calls: Callable[[float], Sequence[tuple[Any, ...]]],
    margin: float,
    seconds: float,
) -> tuple[float, list[dict[str, Any]]]:
    """The common start and results of ``fn`` over ``calls(start)``, one per process.

    Each call reports ``on_time``: whether it was set up before the start. One that was
    not (a loaded machine) worked for less than its share of the time, so the round runs
    again with twice the margin. ``calls`` is asked anew each time: reset state there.
    """
    for _ in range(4):
        start = time.monotonic() + margin
        results = crew.map_all(fn, calls(start), timeout=margin + seconds + 120)
        if all(res["on_time"] for res in results):
            return start, results
        margin *= 2
    raise RuntimeError(f"workers not set up {margin / 2:g} s after their work was handed out")


def run_alone(fn: Callable[..., Any], *args: Any, timeout: float = 300.0) -> Any:
    """Run ``fn(*args)`` in a fresh spawned process (clean thread and CPU counts)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args).result(timeout=timeout)


def describe_error(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= 90 else text[:87] + "..."
