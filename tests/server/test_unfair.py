"""``fair=False``: a released lock is anyone's (a caller may barge in ahead of the queue),
and its first waiter is woken to compete, one at a time; but a waiter queued longer than
UNFAIR_STARVING is handed the lock by the next release, as a fair lock would hand it, so
no stream of bargers keeps it waiting long. Keys keep their TTLs throughout."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis
import redis.asyncio as aredis

import redlease
from redlease._base.timing import UNFAIR_STARVING
from waiting_helpers import in_thread, lock_key, queued, wait_until


def test_a_starving_waiter_is_handed_the_lock_ahead_of_a_barger(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, fair=False)
    holder = lock.acquire()
    waiter, got = in_thread(lambda: lock.acquire(timeout=30))
    wait_until(lambda: queued(r, name) == 1)
    time.sleep(UNFAIR_STARVING * 1.5)  # the waiter is starving now
    holder.release()
    assert lock.try_acquire() is None  # the release handed it on: no barging in
    waiter.join(30)
    assert isinstance(got[0], redlease.Lease)
    assert got[0].fence > holder.fence
    got[0].release()


def test_a_woken_waiter_stays_first_and_a_free_lock_reaches_it(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, fair=False)
    holder = lock.acquire()
    first, got_first = in_thread(lambda: lock.acquire(timeout=30))
    wait_until(lambda: queued(r, name) == 1)
    second, got_second = in_thread(lambda: lock.acquire(timeout=30))
    wait_until(lambda: queued(r, name) == 2)
    holder.release()  # wakes the first; if a barger beat it, it stays first in line
    first.join(30)
    assert isinstance(got_first[0], redlease.Lease)
    woken = r.pttl(lock_key(name) + ":woken")
    assert woken == -2 or woken > 0  # gone, or with its TTL
    got_first[0].release()  # nobody barges now: the second gets it, long before its ttl
    second.join(30)
    assert isinstance(got_second[0], redlease.Lease)
    got_second[0].release()
    assert r.exists(lock_key(name)) == 0


async def test_an_async_starving_waiter_is_handed_the_lock(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0, fair=False)
    holder = await lock.acquire()
    waiting: asyncio.Task[Any] = asyncio.create_task(lock.acquire(timeout=30))
    for _ in range(2000):  # until it is queued
        if await ar.llen(lock_key(name) + ":line"):
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(UNFAIR_STARVING * 1.5)
    await holder.release()
    assert await lock.try_acquire() is None
    lease = await asyncio.wait_for(waiting, 30)
    await lease.release()


def test_a_waiter_that_lost_to_a_barger_stays_first_in_line(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, fair=False)
    holder = lock.acquire()
    order: list[int] = []

    def waiter(i: int) -> None:
        with lock.acquire(timeout=30):
            order.append(i)

    first, _ = in_thread(lambda: waiter(1))
    wait_until(lambda: queued(r, name) == 1)
    second, _ = in_thread(lambda: waiter(2))
    wait_until(lambda: queued(r, name) == 2)
    holder.release()
    barged = lock.try_acquire()  # straight back: usually ahead of the woken first waiter
    time.sleep(0.05)  # the first waiter, woken, lost the race (if the barger won it)
    if barged is not None:
        barged.release()
    first.join(30)
    second.join(30)
    assert order == [1, 2]  # the first waiter was not sent to the back of the line
