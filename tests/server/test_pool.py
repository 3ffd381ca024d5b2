"""redlease's own pool of connections to a server, at its bound: the callers waiting for
a connection are served first come first served, each woken by the give-back that frees
one, and never by a timer (a thousand tasks waiting once cost the loop a thousand wakes
each give-back, a hundred times a second)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis
import redis.asyncio as aredis

from redlease._async import conn as aconn
from redlease._sync import conn as sconn
from redlease._wire.endpoint import endpoint_of
from redlease.tools import servers
from waiting_helpers import wait_until

WAITERS = 6
APART = 0.2  # between two give-backs: twenty of the old timer's looks


class _Counted:
    """A pool's ``Freed``, counting the waits of the callers waiting for a connection."""

    def __init__(self, freed: Any) -> None:
        self.freed, self.waits = freed, 0

    def wait(self, timeout: float) -> Any:
        self.waits += 1
        return self.freed.wait(timeout)

    def notify(self) -> None:
        self.freed.notify()


async def test_async_takers_at_the_bound_are_served_in_order_one_wake_each(
    server: servers.ServerProcess,
) -> None:
    client = aredis.Redis(port=server.port)
    pool = aconn.Pool(endpoint_of(client, asyncio=True))
    held: list[Any] = [await pool.take(5.0) for _ in range(aconn.MAX_CONNECTIONS)]
    counted = pool._freed = _Counted(pool._freed)  # type: ignore[assignment]
    served: list[int] = []

    async def taker(i: int) -> None:
        conn = await pool.take(30.0)
        served.append(i)
        held.insert(0, conn)  # (kept: each give-back serves one taker)

    tasks = []
    for i in range(WAITERS):
        tasks.append(asyncio.create_task(taker(i)))
        for _ in range(5000):  # queued, in this order
            if counted.waits >= i + 1:
                break
            await asyncio.sleep(0.001)
    for given in range(1, WAITERS + 1):
        pool.give(held.pop())
        await asyncio.sleep(APART)
        for _ in range(10000):
            if len(served) == given:
                break
            await asyncio.sleep(0.001)
        assert served == list(range(given))  # one each, first come first served
    assert counted.waits <= 2 * WAITERS  # (each waited once or so: no timer)
    for conn in held:
        pool.give(conn)
    await client.aclose()


def test_takers_at_the_bound_are_served_in_order_one_wake_each(
    server: servers.ServerProcess,
) -> None:
    client = redis.Redis(port=server.port)
    pool = sconn.Pool(endpoint_of(client, asyncio=False))
    held: list[Any] = [pool.take(5.0) for _ in range(sconn.MAX_CONNECTIONS)]
    counted = pool._freed = _Counted(pool._freed)  # type: ignore[assignment]
    served: list[int] = []

    def taker(i: int) -> None:
        conn = pool.take(30.0)
        served.append(i)
        held.insert(0, conn)  # (kept: each give-back serves one taker)

    threads = []
    for i in range(WAITERS):
        thread = threading.Thread(target=taker, args=(i,))
        thread.start()
        threads.append(thread)
        wait_until(lambda i=i: counted.waits >= i + 1)  # queued, in this order
    for given in range(1, WAITERS + 1):
        pool.give(held.pop())
        time.sleep(APART)
        wait_until(lambda given=given: len(served) == given)
        assert served == list(range(given))  # one each, first come first served
    for thread in threads:
        thread.join(30)
    assert counted.waits <= 2 * WAITERS
    for conn in held:
        pool.give(conn)
    client.close()


async def test_a_taker_that_gives_up_passes_its_wake_on(server: servers.ServerProcess) -> None:
    client = aredis.Redis(port=server.port)
    pool = aconn.Pool(endpoint_of(client, asyncio=True))
    held: list[Any] = [await pool.take(5.0) for _ in range(aconn.MAX_CONNECTIONS)]
    first = asyncio.create_task(pool.take(30.0))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(pool.take(30.0))
    await asyncio.sleep(0.05)
    pool.give(held.pop())  # wakes the first...
    first.cancel()  # ...which is cancelled before it runs: the second is served
    conn = await asyncio.wait_for(second, 5)
    assert first.cancelled()
    assert conn is not None
    pool.give(conn)
    for other in held:
        pool.give(other)
    await client.aclose()


async def test_a_connection_given_back_while_callers_wait_is_kept_for_them(
    server: servers.ServerProcess,
) -> None:
    """Past MAX_IDLE a connection given back is closed, unless a caller waits for one:
    then it serves that caller, who would otherwise open another (a burst of tasks
    opened hundreds so, each give-back's connection closed and a new one made)."""
    client = aredis.Redis(port=server.port)
    admin = aredis.Redis(port=server.port)
    pool = aconn.Pool(endpoint_of(client, asyncio=True))
    held: list[Any] = [await pool.take(5.0) for _ in range(aconn.MAX_CONNECTIONS)]
    takers = [asyncio.create_task(pool.take(30.0)) for _ in range(2 * aconn.MAX_IDLE)]
    await asyncio.sleep(0.05)  # (all waiting: the pool is at its bound)
    opened = (await admin.info("stats"))["total_connections_received"]
    for conn in held[: 2 * aconn.MAX_IDLE]:
        pool.give(conn)  # all at once: past MAX_IDLE before any taker has run
    served = await asyncio.wait_for(asyncio.gather(*takers), 10)
    assert (await admin.info("stats"))["total_connections_received"] == opened
    for conn in [*served, *held[2 * aconn.MAX_IDLE :]]:
        pool.give(conn)
    await client.aclose()
    await admin.aclose()
