"""asyncio cancellation at each await of an acquisition or a release leaves no lock
behind that the caller does not know about. The cancellation is delivered while an
operation is in flight (written, reply not yet read): the hardest case, because the
server may have applied it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aredis

import redlease
from redlease._async.io import AsyncIO
from waiting_helpers import lock_key


class CancelDuring(AsyncIO):
    """The real driver, except that the ``at``-th operation is cancelled in flight."""

    def __init__(self, client: Any, at: int) -> None:
        super().__init__(client)
        self.at, self.seen = at, 0

    async def execute(self, op: Any) -> Any:
        self.seen += 1
        if self.seen == self.at:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # lands at the first await inside the operation
        return await super().execute(op)


async def lock_state(ar: aredis.Redis, name: str) -> tuple[Any, int, int]:
    tag = lock_key(name)
    return (await ar.get(tag), await ar.llen(tag + ":queue"), await ar.hlen(tag + ":waiters"))


@pytest.mark.parametrize(
    ("busy", "at"),
    [(False, 1), (True, 1), (True, 2)],
    ids=["free-in-acquire-script", "busy-in-acquire-script", "busy-in-wait"],
)
async def test_cancelled_acquire_leaves_nothing_behind(
    ar: aredis.Redis, name: str, busy: bool, at: int
) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0)
    holder = await lock.acquire() if busy else None
    lock._io = CancelDuring(ar, at)
    with pytest.raises(asyncio.CancelledError):
        await lock.acquire(timeout=10)
    value, queue_len, waiters = await lock_state(ar, name)
    assert queue_len == 0
    assert waiters == 0
    if holder is None:
        assert value is None  # the lock that was set in flight was released again
    else:
        assert value == holder.token.encode()
        await holder.release()
        assert (await lock_state(ar, name))[0] is None  # nothing was handed to the ghost


async def test_cancelled_while_the_grant_arrives(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0)
    for _ in range(20):
        holder = await lock.acquire()
        waiter = asyncio.ensure_future(lock.acquire(timeout=10))
        for _ in range(10_000):  # until the waiter is queued
            if (await lock_state(ar, name))[1]:
                break
            await asyncio.sleep(0.001)
        await holder.release()  # grants the lock to the waiter...
        waiter.cancel()  # ...which is cancelled as (or just after) the grant arrives
        try:
            lease = await waiter
        except asyncio.CancelledError:
            assert (await lock_state(ar, name))[0] is None  # given back, nobody holds it
        else:
            await lease.release()  # the grant won the race and reached the caller
        assert (await lock_state(ar, name))[1:] == (0, 0)


async def test_cancelled_release_still_releases(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0)
    lease = await lock.acquire()
    lease._io = CancelDuring(ar, 1)
    with pytest.raises(asyncio.CancelledError):
        await lease.release()
    assert (await lock_state(ar, name))[0] is None


async def test_cancelled_async_with_releases(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0)
    entered = asyncio.Event()

    async def body() -> None:
        async with lock:
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.ensure_future(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await lock_state(ar, name))[0] is None


async def test_wait_for_timeout_around_acquire(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0)
    holder = await lock.acquire()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(lock.acquire(), 0.2)
    assert (await lock_state(ar, name))[1:] == (0, 0)
    await holder.release()
    assert (await lock_state(ar, name))[0] is None
