"""The small things users of other lock libraries expect, on real servers:
``locked()``, ``owned()`` and ``waiting()`` (sync and asyncio, per thread or task, as
the server says); a lock object as a decorator (``@lock``, ``@alock``; what it refuses);
and ``alock.using(fn, ...)``, which runs ``fn`` under a renewed lease and cancels it if
the lease is lost."""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import redlease
from redlease._rules.keys import LockKeys
from redlease.tools import servers
from waiting_helpers import in_thread, wait_until


def in_another_thread(fn: Any) -> Any:
    """``fn()`` run in another thread, its result (or error) returned."""
    thread, out = in_thread(fn)
    thread.join(60)
    return out[0]


# -- locked(), owned(), waiting() --------------------------------------------------------


def test_locked_owned_and_waiting(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    assert not lock.locked()
    assert not lock.owned()
    assert lock.waiting() == 0
    lease = lock.acquire(timeout=1)
    assert lock.locked()
    assert lock.owned()
    assert in_another_thread(lock.owned) is False  # another thread: not its lease
    assert in_another_thread(lock.locked) is True
    assert not redlease.Lock(r, name, ttl=30.0).owned()  # another object: not its lease
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=120)))
    waiter.start()
    wait_until(lambda: lock.waiting() == 1, timeout=60)
    lease.release()
    waiter.join(60)
    assert not lock.owned()  # released here; the waiter's lease is its thread's
    assert lock.locked()
    assert lock.waiting() == 0
    got[0].release()
    assert not lock.locked()


def test_owned_asks_the_server(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    lease = lock.acquire(timeout=1)
    assert lock.owned()
    r.delete(LockKeys.for_name(name).lock)  # gone on the server; the lease does not know
    assert not lease.lost
    assert not lock.owned()
    r.set(LockKeys.for_name(name).lock, "someone else", px=30_000)
    assert not lock.owned()
    assert lock.locked()


def test_owned_is_false_for_a_lease_run_out(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=0.3)
    lease = lock.acquire(timeout=1)
    r.pexpire(LockKeys.for_name(name).lock, 60_000)  # the server still has it...
    time.sleep(0.5)
    assert lease.lost  # ...but its validity ran out here: no longer safe to act on
    assert lock.locked()
    assert not lock.owned()


def test_waiting_counts_live_waiters_only(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    keys = LockKeys.for_name(name)
    lock = redlease.Lock(r, name, ttl=30.0)
    lease = lock.acquire(timeout=1)
    code = textwrap.dedent(f"""
        import redis, redlease
        r = redis.Redis.from_url({server.url!r})
        redlease.Lock(r, {name!r}, ttl=0.5).acquire(timeout=60)
    """)
    dead = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_until(lambda: r.llen(keys.queue) == 1, timeout=60)
    finally:
        dead.kill()
        dead.wait(30)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=120)))
    waiter.start()
    try:
        wait_until(lambda: r.llen(keys.queue) == 2, timeout=60)
        # the dead waiter's entry runs out within about 2 s; it stays queued
        wait_until(lambda: lock.waiting() == 1, timeout=60)
        assert r.llen(keys.queue) == 2
    finally:
        lease.release()
        waiter.join(60)
    got[0].release()


async def test_async_locked_owned_and_waiting_per_task(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0)
    assert not await lock.locked()
    assert not await lock.owned()
    lease = await lock.acquire(timeout=1)
    assert await lock.locked()
    assert await lock.owned()
    assert not await asyncio.create_task(lock.owned())  # another task: not its lease
    waiting = asyncio.create_task(lock.acquire(timeout=60))
    for _ in range(4000):
        if await lock.waiting() == 1:
            break
        await asyncio.sleep(0.005)
    assert await lock.waiting() == 1
    await lease.release()
    second = await asyncio.wait_for(waiting, 60)
    assert not await lock.owned()
    assert await lock.locked()
    await second.release()
    assert not await lock.locked()


def test_semaphore_and_read_write_sides(r: redis.Redis, name: str) -> None:
    sem = redlease.Semaphore(r, name, 3, ttl=30.0)
    assert not sem.locked()
    permits = [sem.acquire(timeout=1), sem.acquire(timeout=1)]
    assert sem.locked()
    assert sem.owned()
    assert in_another_thread(sem.owned) is False
    permits[0].release()
    assert sem.owned()  # the other permit
    permits[1].release()
    assert not sem.owned()
    assert not sem.locked()

    rw = redlease.ReadWriteLock(r, name, ttl=30.0)
    write = rw.write.acquire(timeout=1)
    assert rw.write.owned()
    assert not rw.read.owned()  # a side's leases are its own
    assert rw.read.locked()  # the read/write lock is held (by a writer)
    write.release()
    assert not rw.write.locked()


async def test_async_semaphore_owned(ar: aredis.Redis, name: str) -> None:
    sem = redlease.AsyncSemaphore(ar, name, 2, ttl=30.0)
    permit = await sem.acquire(timeout=1)
    assert await sem.owned()
    assert await sem.locked()
    assert await sem.waiting() == 0
    await permit.release()
    assert not await sem.owned()


# -- decorators ----------------------------------------------------------------------------


def test_a_lock_as_a_decorator(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)

    @lock
    def work(x: int, *, y: int = 1) -> int:
        """Doc kept."""
        assert lock.owned()  # under the lock, held by this thread
        return x + y

    assert work(2, y=3) == 5
    assert work.__name__ == "work"
    assert work.__doc__ == "Doc kept."
    assert work.__wrapped__ is not None  # type: ignore[attr-defined]
    assert not lock.locked()  # released after the call

    @lock
    def fails() -> None:
        assert lock.locked()
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fails()
    assert not lock.locked()


def test_a_decorated_function_excludes_other_threads(r: redis.Redis, name: str) -> None:
    inside: list[int] = []
    overlaps: list[int] = []

    @redlease.Lock(r, name, ttl=30.0)
    def critical() -> None:
        inside.append(1)
        if len(inside) > 1:
            overlaps.append(1)
        time.sleep(0.01)
        inside.pop()

    threads = [threading.Thread(target=lambda: [critical() for _ in range(5)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert overlaps == []


async def test_an_async_lock_as_a_decorator(ar: aredis.Redis, name: str) -> None:
    alock = redlease.AsyncLock(ar, name, ttl=30.0)

    @alock
    async def work(x: int) -> int:
        assert await alock.owned()
        await asyncio.sleep(0)
        return x * 2

    assert await work(21) == 42
    assert work.__name__ == "work"
    assert not await alock.locked()


def test_what_a_decorator_refuses(r: redis.Redis, ar: aredis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    alock = redlease.AsyncLock(ar, name, ttl=30.0)

    async def coroutine_function() -> None:
        pass

    def generator_function() -> Iterator[int]:
        yield 1

    async def async_generator_function() -> AsyncIterator[int]:
        yield 1

    def plain() -> None:
        pass

    with pytest.raises(redlease.InvalidArgument, match="coroutine function"):
        lock(coroutine_function)
    with pytest.raises(redlease.InvalidArgument, match="generator function"):
        lock(generator_function)
    with pytest.raises(redlease.InvalidArgument, match="generator function"):
        alock(async_generator_function)  # type: ignore[arg-type]
    with pytest.raises(redlease.InvalidArgument, match="async def"):
        alock(plain)  # type: ignore[arg-type]
    with pytest.raises(redlease.InvalidArgument, match="decorates a function"):
        lock(42)  # type: ignore[arg-type]

    class AsyncCallable:
        async def __call__(self) -> None:
            pass

    sneaky: Any = lock(AsyncCallable())  # looks plain; found out at its first call
    with pytest.raises(redlease.InvalidArgument, match="returned a coroutine"):
        sneaky()
    assert not lock.locked()


def test_every_front_decorates(r: redis.Redis, name: str) -> None:
    seen: list[bool] = []

    def held(kind: str, of: str) -> None:
        seen.append(redlease.read_info(r, of, kind=kind).held)

    redlease.Semaphore(r, name, 2, ttl=30.0)(lambda: held("semaphore", name))()
    rw = redlease.ReadWriteLock(r, name, ttl=30.0)
    rw.read(lambda: held("rwlock", name))()
    rw.write(lambda: held("rwlock", name))()
    redlease.Redlock([r], name, ttl=30.0)(lambda: held("lock", name))()
    multi = redlease.MultiLock(r, [name + ":a", name + ":b"], ttl=30.0)
    multi(lambda: held("lock", name + ":b"))()
    assert seen == [True] * 5
    assert not redlease.read_info(r, name).held
    assert not redlease.read_info(r, name + ":b").held


async def test_async_multilock_decorates(ar: aredis.Redis, name: str) -> None:
    multi = redlease.AsyncMultiLock(ar, [name + ":a", name + ":b"], ttl=30.0)

    @multi
    async def work() -> bool:
        return (await redlease.aread_info(ar, name + ":a")).held

    assert await work()
    assert not (await redlease.aread_info(ar, name + ":a")).held


# -- using() -------------------------------------------------------------------------------


async def test_using_returns_and_releases(ar: aredis.Redis, name: str) -> None:
    alock = redlease.AsyncLock(ar, name, ttl=30.0)

    async def work(lease: redlease.AsyncLease, a: int, b: int) -> int:
        info = await redlease.aread_info(ar, name)
        assert [h.token for h in info.holders] == [lease.token]
        return a + b

    assert await alock.using(work, 1, 2, timeout=5) == 3
    assert not await alock.locked()
    assert await alock.using(functools.partial(work, b=10), 5) == 15


async def test_using_renews_for_as_long_as_fn_runs(ar: aredis.Redis, name: str) -> None:
    alock = redlease.AsyncLock(ar, name, ttl=1.0)  # auto_renew is off

    async def long_work(lease: redlease.AsyncLease) -> str:
        await asyncio.sleep(3.0)  # three ttls
        lease.check()
        assert await alock.owned() is False  # (owned() is per task: this is fn's own)
        holders = (await redlease.aread_info(ar, name)).holders
        assert [h.token for h in holders] == [lease.token]
        return "done"

    assert await asyncio.wait_for(alock.using(long_work), 60) == "done"
    assert not await alock.locked()


async def test_using_cancels_fn_and_raises_lock_lost_when_the_lease_is_lost(
    ar: aredis.Redis, name: str
) -> None:
    alock = redlease.AsyncLock(ar, name, ttl=1.0)
    started = asyncio.Event()
    cancelled: list[bool] = []

    async def forever(lease: redlease.AsyncLease) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    using = asyncio.create_task(alock.using(forever))
    await asyncio.wait_for(started.wait(), 30)
    await ar.delete(LockKeys.for_name(name).lock)  # taken away: the next renewal fails
    with pytest.raises(redlease.LockLost) as lost:
        await asyncio.wait_for(using, 30)
    assert isinstance(lost.value.__cause__, asyncio.CancelledError)
    assert cancelled == [True]
    assert not await alock.locked()


async def test_using_propagates_fn_errors_and_releases(ar: aredis.Redis, name: str) -> None:
    alock = redlease.AsyncLock(ar, name, ttl=30.0)

    async def fails(lease: redlease.AsyncLease) -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await alock.using(fails)
    assert not await alock.locked()

    def not_async(lease: redlease.AsyncLease) -> int:
        return 1

    with pytest.raises(redlease.InvalidArgument, match="async callable"):
        await alock.using(not_async)  # type: ignore[arg-type]
    assert not await alock.locked()


async def test_cancelling_the_caller_cancels_fn_and_releases(ar: aredis.Redis, name: str) -> None:
    alock = redlease.AsyncLock(ar, name, ttl=30.0)
    started = asyncio.Event()
    ended: list[str] = []

    async def forever(lease: redlease.AsyncLease) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # its clean-up takes a moment: waited for
            ended.append("cancelled")
            raise

    using = asyncio.create_task(alock.using(forever))
    await asyncio.wait_for(started.wait(), 30)
    assert await alock.locked()
    using.cancel()
    with pytest.raises(asyncio.CancelledError):
        await using
    assert ended == ["cancelled"]  # fn ended before using() did
    assert not await alock.locked()
