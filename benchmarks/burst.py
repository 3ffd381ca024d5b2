"""Section 16: a burst. Thousands of asyncio tasks in one process ask at once for names
another process holds, so every one must queue on the server; how long until all of
them are queued, against how long redis-py's ``BlockingConnectionPool`` (32
connections) takes to run two EVALSHAs (a SET NX PX script and a compare-and-delete
one, a lock's two) for as many tasks: the same number of round trips through a bounded
pool. Then, with every task waiting, the connections the process holds on the server
and the commands it sends while idle.

Each figure runs in a fresh spawned process (clean pools); the names are held by this
process, on a connection of its own, and released at the end of each round. Rounds
alternate, and the figures are medians of rounds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis
import redis.asyncio as aredis

import redlease

from ._common import Settings, calls_between, command_calls, describe_error, median, run_alone
from ._report import NA, Row, times, verdict

SECTION = "16. a burst: thousands of asyncio waiters queued at once, in one process"
TTL = 120.0
POOL = 32  # redis-py's BlockingConnectionPool in the reference
HANDFUL = 10  # connections a process of waiters may hold once they all wait
IDLE = 1.0  # seconds of the idle window
_SET_NX = "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])"
_DEL_IF = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


def _name(names: int, i: int) -> str:
    return f"bench:burst:{i % names}"


def _connected(admin: redis.Redis) -> int:
    return int(admin.info("clients")["connected_clients"])


def redlease_burst(port: int, names: int, tasks: int) -> dict[str, Any]:
    """In a fresh process: ``tasks`` asyncio waiters on ``names`` held names. The time
    until all are queued (the server's RPUSH count, read by a thread on its own
    connection),
    the most connections the server saw meanwhile and once they all wait, and the
    commands the process sends in an idle second."""
    admin = redis.Redis(host="127.0.0.1", port=port)
    before = _connected(admin)
    peak = [before]
    queued_at: list[float] = []
    go = threading.Event()

    def pushed() -> int:
        # every entry a queue gains is one RPUSH (in the acquire script), and one INFO
        # reads them all: the watching costs the server next to nothing
        return int(admin.info("commandstats").get("cmdstat_rpush", {}).get("calls", 0))

    def watch(started: float, before: int) -> None:
        while not go.is_set():
            waiting = pushed() - before
            peak[0] = max(peak[0], _connected(admin))
            if waiting >= tasks:
                queued_at.append(time.perf_counter() - started)
                return
            time.sleep(0.002)

    async def main() -> dict[str, Any]:
        client = aredis.Redis(host="127.0.0.1", port=port)
        locks = [redlease.AsyncLock(client, f"bench:burst:{n}", ttl=TTL) for n in range(names)]
        await locks[0].try_acquire()  # (the server looked at once, as a warm process has)
        before_pushed = pushed()
        started = time.perf_counter()
        waiters = [asyncio.create_task(locks[i % names].acquire(timeout=TTL)) for i in range(tasks)]
        watcher = threading.Thread(target=watch, args=(started, before_pushed), daemon=True)
        watcher.start()
        try:
            deadline = time.monotonic() + 120.0
            while watcher.is_alive():
                failed = [t for t in waiters if t.done() and t.exception() is not None]
                if failed:
                    raise failed[0].exception()  # type: ignore[misc]
                if time.monotonic() > deadline:
                    raise TimeoutError("the waiters did not all queue")
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # anything in flight lands
            held = _connected(admin) - before
            calls = command_calls(admin)
            await asyncio.sleep(IDLE)
            idle = calls_between(calls, command_calls(admin))
            sent = sum(n for k, n in idle.items() if not k.endswith(":failed"))
            return {
                "seconds": queued_at[0],
                "held": held,
                "peak": peak[0] - before,
                "idle": sent,
            }
        finally:
            go.set()
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
            await client.aclose()

    try:
        return asyncio.run(main())
    finally:
        admin.close()


def reference_burst(port: int, names: int, tasks: int) -> dict[str, Any]:
    """In a fresh process: ``tasks`` asyncio tasks, each two EVALSHAs through redis-py's
    ``BlockingConnectionPool`` of 32 connections; the time until all are done."""

    async def main() -> dict[str, Any]:
        pool = aredis.BlockingConnectionPool(host="127.0.0.1", port=port, max_connections=POOL)
        client = aredis.Redis(connection_pool=pool)
        take = await client.script_load(_SET_NX)
        give = await client.script_load(_DEL_IF)

        async def one(i: int) -> None:
            token = f"t{i}"
            key = _name(names, i) + ":ref"
            await client.evalsha(take, 1, key, token, str(int(TTL * 1000)))
            await client.evalsha(give, 1, key, token)

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(tasks)))
        seconds = time.perf_counter() - started
        await client.aclose()
        await pool.aclose()
        return {"seconds": seconds}

    return asyncio.run(main())


def _round(port: int, settings: Settings) -> tuple[dict[str, Any], dict[str, Any]]:
    names, tasks = settings.burst_names, settings.burst_tasks
    holder = redis.Redis(host="127.0.0.1", port=port)
    held = [
        redlease.Lock(holder, f"bench:burst:{n}", ttl=TTL).acquire(timeout=5.0)
        for n in range(names)
    ]
    try:
        mine = run_alone(redlease_burst, port, names, tasks, timeout=300.0)
    finally:
        for lease in held:
            lease.release()
        holder.close()
    ref = run_alone(reference_burst, port, names, tasks, timeout=300.0)
    return mine, ref


def run(port: int, settings: Settings) -> list[Row]:
    label = "redlease AsyncLock"
    tasks = settings.burst_tasks
    mine: list[dict[str, Any]] = []
    refs: list[dict[str, Any]] = []
    try:
        for _ in range(settings.burst_rounds):
            got, ref = _round(port, settings)
            mine.append(got)
            refs.append(ref)
    except Exception as exc:
        return [
            Row(SECTION, label, "all queued", None, f"error: {describe_error(exc)}", verdict=NA)
        ]
    queued = median([m["seconds"] for m in mine])
    reference = median([r["seconds"] for r in refs])
    held = max(m["held"] for m in mine)
    idle = max(m["idle"] for m in mine)
    peak = max(m["peak"] for m in mine)
    ref_label = f"redis-py asyncio, BlockingConnectionPool({POOL})"
    names = settings.burst_names
    return [
        Row(
            SECTION,
            label,
            f"{tasks:,} waiters on {names} held names: all queued",
            queued,
            f"{queued * 1000:,.0f} ms",
            ratio=times(queued / reference, "redis-py"),
            bar="<= 1.0x redis-py",
            verdict=verdict(queued <= reference),
            extra={"rounds_s": [round(m["seconds"], 3) for m in mine]},
        ),
        Row(SECTION, label, "connections at the burst's peak", float(peak), f"{peak:,}"),
        Row(
            SECTION,
            label,
            "connections held once all wait",
            float(held),
            f"{held:,}",
            bar=f"<= {HANDFUL}",
            verdict=verdict(held <= HANDFUL),
        ),
        Row(
            SECTION,
            label,
            f"commands sent in {IDLE:g} s while all wait",
            float(idle),
            f"{idle:,}",
            bar="0",
            verdict=verdict(idle == 0),
        ),
        Row(
            SECTION,
            ref_label,
            f"{tasks:,} tasks, two EVALSHAs each: all done",
            reference,
            f"{reference * 1000:,.0f} ms",
            extra={"rounds_s": [round(r["seconds"], 3) for r in refs]},
        ),
    ]


def note(settings: Settings) -> str:
    return (
        f"burst: {settings.burst_rounds} round(s), each process fresh; the names held by "
        "another process; 'all queued' is timed from the first task's start until the "
        "server's queues hold every waiter (its RPUSH count, read every 2 ms on a connection "
        "of its own, counted in the peak); the idle window counts every command the server "
        "receives."
    )
