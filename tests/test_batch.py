"""Batches (``batch=n``): a holder granted the lock from the queue may take it again ahead
of the queue up to n holds in a row, within ``batch_window``; then the next waiter's turn
comes, and a lock left free when the window ends is taken at once by the next in line."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
import redis

import redlease
from redlease import servers
from waiting_helpers import queued, wait_until


class Waiter(threading.Thread):
    """Acquires ``lock`` once in a thread; records when it got it, holds until told."""

    def __init__(self, lock: redlease.Lock) -> None:
        super().__init__(daemon=True)
        self.lock = lock
        self.lease: redlease.Lease | None = None
        self.got_at = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        self.lease = self.lock.acquire(timeout=30)
        self.got_at = time.monotonic()
        self.done.wait(30)
        self.lease.release()


def start_batch(r: redis.Redis, name: str, owner: redlease.Lock) -> redlease.Lease:
    """Make ``owner`` get the lock from the queue (which starts its batch)."""
    first = redlease.Lock(r, name, ttl=30.0).acquire()
    granted: list[redlease.Lease] = []
    taker = threading.Thread(target=lambda: granted.append(owner.acquire(timeout=30)))
    taker.start()
    wait_until(lambda: queued(r, name) == 1)
    first.release()
    taker.join(30)
    return granted[0]


def test_the_owner_holds_again_ahead_of_the_queue_up_to_its_holds(
    r: redis.Redis, name: str
) -> None:
    owner = redlease.Lock(r, name, ttl=30.0, batch=3, batch_window=20.0)
    lease = start_batch(r, name, owner)  # hold 1 of 3
    other = Waiter(redlease.Lock(r, name, ttl=30.0))
    other.start()
    wait_until(lambda: queued(r, name) == 1)
    fences = [lease.fence]
    lease.release()
    assert r.exists("{" + name + "}") == 0  # left free for the owner, nobody woken
    assert queued(r, name) == 1
    assert redlease.Lock(r, name, ttl=30.0).try_acquire() is None  # not for a newcomer
    for _ in range(2):  # holds 2 and 3
        again = owner.try_acquire()
        assert again is not None
        fences.append(again.fence)
        again.release()
    wait_until(lambda: other.lease is not None)  # the third release handed it on
    assert owner.try_acquire() is None
    other.done.set()
    other.join(30)
    assert fences == sorted(set(fences))
    assert other.lease is not None
    assert other.lease.fence > fences[-1]


@pytest.mark.parametrize("queued_when", ["before the batch", "during the batch"])
def test_a_lock_left_free_goes_to_the_next_in_line_when_the_window_ends(
    r: redis.Redis, name: str, queued_when: str
) -> None:
    window = 0.3
    owner = redlease.Lock(r, name, ttl=30.0, batch=8, batch_window=window)
    other = Waiter(redlease.Lock(r, name, ttl=30.0))
    if queued_when == "before the batch":
        first = redlease.Lock(r, name, ttl=30.0).acquire()
        granted: list[redlease.Lease] = []
        taker = threading.Thread(target=lambda: granted.append(owner.acquire(timeout=30)))
        taker.start()
        wait_until(lambda: queued(r, name) == 1)
        other.start()  # behind the owner: told when the owner's batch starts
        wait_until(lambda: queued(r, name) == 2)
        first.release()
        taker.join(30)
        lease = granted[0]
    else:
        lease = start_batch(r, name, owner)
        other.start()  # told by its own try how long the window lasts
        wait_until(lambda: queued(r, name) == 1)
    started = time.monotonic()
    lease.release()  # within the batch: the lock stays free for the owner, which leaves
    other.join(0.0)
    wait_until(lambda: other.lease is not None, timeout=20)
    # woken by the window's end, not by the ttl (30 s) or the wait's horizon
    assert other.got_at - started < window + 3.0
    other.done.set()
    other.join(30)


def test_a_batch_ends_with_its_window(r: redis.Redis, name: str) -> None:
    window = 0.2
    owner = redlease.Lock(r, name, ttl=30.0, batch=100, batch_window=window)
    lease = start_batch(r, name, owner)
    other = Waiter(redlease.Lock(r, name, ttl=30.0))
    other.start()
    wait_until(lambda: queued(r, name) == 1)
    time.sleep(window + 0.1)
    lease.release()  # after the window: handed on, however many holds were left
    wait_until(lambda: other.lease is not None)
    assert owner.try_acquire() is None
    other.done.set()
    other.join(30)


def test_batch_one_is_the_strict_hand_over(r: redis.Redis, name: str) -> None:
    owner = redlease.Lock(r, name, ttl=30.0)  # batch=1, the default
    lease = start_batch(r, name, owner)
    other = Waiter(redlease.Lock(r, name, ttl=30.0))
    other.start()
    wait_until(lambda: queued(r, name) == 1)
    lease.release()
    wait_until(lambda: other.lease is not None)
    assert owner.try_acquire() is None
    other.done.set()
    other.join(30)


async def until_queued(r: redis.Redis, name: str) -> None:
    for _ in range(4000):
        if queued(r, name):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("nobody queued")


async def test_asyncio_batches_behave_the_same(ar: Any, r: redis.Redis, name: str) -> None:
    owner = redlease.AsyncLock(ar, name, ttl=30.0, batch=2, batch_window=20.0)
    newcomer = redlease.AsyncLock(ar, name, ttl=30.0)
    first = await newcomer.acquire()
    taking = asyncio.ensure_future(owner.acquire(timeout=30))
    await until_queued(r, name)
    await first.release()
    lease = await taking  # from the queue: hold 1 of 2
    waiting = asyncio.ensure_future(newcomer.acquire(timeout=30))
    await until_queued(r, name)
    await lease.release()
    again = await owner.try_acquire()  # hold 2 of 2, ahead of the queue
    assert again is not None
    await again.release()  # the batch is spent: handed on
    other = await asyncio.wait_for(waiting, 10)
    assert other.fence == again.fence + 1
    await other.release()


def test_processes_in_batches_exclude_each_other(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    code = textwrap.dedent(f"""
        import redis, redlease
        r = redis.Redis.from_url({server.url!r})
        lock = redlease.Lock(r, {name!r}, ttl=10.0, batch=4, batch_window=0.05)
        for _ in range(60):
            with lock:
                r.set("count:" + {name!r}, int(r.get("count:" + {name!r}) or 0) + 1)
    """)
    workers = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(4)]
    for worker in workers:
        assert worker.wait(timeout=120) == 0
    assert int(r.get("count:" + name) or 0) == 240  # no lost update
