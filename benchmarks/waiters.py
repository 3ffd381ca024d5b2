"""Section 8: server connections held by N blocked waiters in one process.

A fresh process (spawned for each figure: clean thread, descriptor and pool counts)
holds the lock, starts N waiters for it (asyncio tasks or threads) and waits until they
have all blocked: queued, for redlease; blocked in BLPOP, for python-redis-lock. The
figure is the server's ``connected_clients`` then, less its count before the process
started (the holder's own connection included). The holder then releases and every
waiter takes the lock in turn. python-redis-lock has no asyncio API: it runs a thread
per waiter, on a client whose pool has room for all of them, and is run with as many
threads as redlease (at most 1,000).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aredis

import redlease
from redlease._rules.keys import LockKeys

from ._common import Settings, describe_error, run_alone
from ._locks import KINDS, make_lock
from ._report import NA, Row, verdict

SECTION = "8. waiters: server connections held by N blocked waiters in one process"
TTL = 120.0
SETTLE_LIMIT = 120.0  # for every waiter to block
HANDFUL = 10  # the bar: whatever the number of waiters
# the contenders and how their waiters wait (python-redis-lock has no asyncio API)
RUNS = (("redlease", "tasks"), ("redlease", "threads"), ("python-redis-lock", "threads"))


def _connected(admin: redis.Redis) -> int:
    return int(admin.info("clients")["connected_clients"]) - 1  # less the asking one


def _settled(admin: redis.Redis, kind: str, name: str, count: int) -> Callable[[], bool]:
    if kind == "redlease":
        return lambda: int(admin.llen(LockKeys.for_name(name).lock + ":line")) >= count
    return lambda: int(admin.info("clients")["blocked_clients"]) >= count


def _until(settled: Callable[[], bool]) -> None:
    deadline = time.monotonic() + SETTLE_LIMIT
    while not settled():
        if time.monotonic() > deadline:
            raise TimeoutError("the waiters did not all block")
        time.sleep(0.05)
    time.sleep(0.2)  # anything in flight lands


def held_by_threads(admin: redis.Redis, port: int, kind: str, count: int, before: int) -> int:
    name = f"bench:w:{kind}:threads:{count}"
    # a pool with room for every waiter (redis-py 8's default holds 100 connections)
    client = redis.Redis(host="127.0.0.1", port=port, max_connections=count + 10)
    holder = make_lock(kind, client, name, TTL)
    held = holder.acquire(timeout=5.0)
    errors: list[BaseException] = []

    def waiter() -> None:
        lock = make_lock(kind, client, name, TTL)  # a lock object per thread, as peers need
        try:
            lock.release(lock.acquire(timeout=TTL))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=waiter, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    settled = _settled(admin, kind, name, count)
    try:
        _until(lambda: bool(errors) or settled())
        if errors:
            raise errors[0]
        return _connected(admin) - before
    finally:
        holder.release(held)
        for t in threads:
            t.join(timeout=SETTLE_LIMIT)


def held_by_tasks(admin: redis.Redis, port: int, count: int, before: int) -> int:
    name = f"bench:w:redlease:tasks:{count}"

    async def main() -> int:
        client = aredis.Redis(host="127.0.0.1", port=port)
        lock = redlease.AsyncLock(client, name, ttl=TTL)
        held = await lock.acquire(timeout=5.0)

        async def waiter() -> None:
            async with await lock.acquire(timeout=TTL):
                pass

        tasks = [asyncio.create_task(waiter()) for _ in range(count)]
        try:
            settled = _settled(admin, "redlease", name, count)
            deadline = time.monotonic() + SETTLE_LIMIT
            while not settled():
                failed = [t for t in tasks if t.done() and t.exception() is not None]
                if failed:
                    raise failed[0].exception()  # type: ignore[misc]
                if time.monotonic() > deadline:
                    raise TimeoutError("the waiters did not all block")
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            return _connected(admin) - before
        finally:
            await held.release()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), TTL)
            await client.aclose()

    return asyncio.run(main())


def measure_one(port: int, kind: str, way: str, count: int) -> int:
    """Connections held by ``count`` waiters (run in a fresh process)."""
    with redis.Redis(host="127.0.0.1", port=port) as admin:
        before = _connected(admin)
        if way == "tasks":
            return held_by_tasks(admin, port, count, before)
        return held_by_threads(admin, port, kind, count, before)


def run(port: int, settings: Settings) -> list[Row]:
    out = []
    for kind, way in RUNS:
        mine = kind == "redlease"
        counts = settings.waiting_tasks if way == "tasks" else settings.waiting_threads
        for count in counts:
            figure = f"connections held by {count:,} waiting {way}"
            try:
                held: Any = run_alone(measure_one, port, kind, way, count, timeout=600.0)
            except Exception as exc:
                shown = f"error: {describe_error(exc)}"
                out.append(
                    Row(SECTION, KINDS[kind], figure, None, shown, verdict=NA if mine else "")
                )
                continue
            out.append(
                Row(
                    SECTION,
                    KINDS[kind],
                    figure,
                    float(held),
                    f"{held:,}",
                    bar=f"<= {HANDFUL}" if mine else "",
                    verdict=verdict(held <= HANDFUL) if mine else "",
                )
            )
    return out
