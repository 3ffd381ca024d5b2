"""A holder (thread; asyncio: task) that asks a read/write lock object for a lease while
it holds one is served at once, never by waiting for itself, by the rules Redisson's,
kazoo's and aiorwlock's read/write locks follow: the same mode nests (one hold more; the
outermost release frees it), a read inside a write is a downgrade, a write inside the
only read an upgrade, and an upgrade that other readers stand in the way of is refused
(``acquire``) or None (``try_acquire``). Another thread or task is another holder."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import families
import redlease
from redlease._rules.keys import LockKeys
from redlease.tools import servers
from waiting_helpers import in_thread, wait_until

TTL = 30.0  # waiting for itself would show as a wait of the ttl


def holds(r: redis.Redis, name: str) -> int:
    return int(r.zcard(LockKeys.for_read_write(name).lock))


def queued(r: redis.Redis, name: str) -> int:
    return int(r.llen(LockKeys.for_read_write(name).queue))


def other_thread(fn: Any) -> Any:
    """``fn()`` in another thread (another holder): its result, or its error."""
    thread, out = in_thread(fn)
    thread.join(30)
    return out[0]


def test_a_read_inside_a_read_is_one_hold_more(r: redis.Redis, name: str) -> None:
    rw = redlease.ReadWriteLock(r, name, ttl=TTL)
    with rw.read as outer:
        with rw.read as inner:
            assert inner is outer
            assert outer.hold_count == 2
            assert rw.read.try_acquire() is outer  # never None, never raises
            outer.release()  # the try's hold
        assert outer.hold_count == 1
        assert not outer.released
        assert holds(r, name) == 1
    assert outer.released
    assert holds(r, name) == 0


def test_a_read_inside_a_read_is_not_held_up_by_a_queued_writer(r: redis.Redis, name: str) -> None:
    rw = redlease.ReadWriteLock(r, name, ttl=TTL)
    with rw.read as outer:
        writer, got = in_thread(lambda: rw.write.acquire(timeout=TTL))
        wait_until(lambda: queued(r, name) == 1)  # the writer waits behind our read
        started = time.monotonic()
        with rw.read as inner:
            assert inner is outer
        assert time.monotonic() - started < TTL / 3
        assert writer.is_alive()
    writer.join(30)
    assert isinstance(got[0], redlease.Lease)
    got[0].release()


def test_a_write_inside_a_write_is_one_hold_more(r: redis.Redis, name: str) -> None:
    rw = redlease.ReadWriteLock(r, name, ttl=TTL)
    with rw.write as outer:
        with rw.write as inner:
            assert inner is outer
            assert outer.hold_count == 2
        assert holds(r, name) == 1
        assert other_thread(rw.read.try_acquire) is None  # still written
    assert holds(r, name) == 0


def test_a_read_inside_a_write_is_a_downgrade(r: redis.Redis, name: str) -> None:
    rw = redlease.ReadWriteLock(r, name, ttl=TTL)
    write = rw.write.acquire(timeout=1)
    read = rw.read.acquire(timeout=1)  # at once, beside the write
    assert read.token != write.token
    assert read.fence > write.fence
    assert other_thread(rw.read.try_acquire) is None  # the write still keeps readers out
    write.release()
    assert not read.lost
    assert holds(r, name) == 1
    other = other_thread(rw.read.try_acquire)  # and other readers may enter
    assert isinstance(other, redlease.Lease)
    assert other_thread(rw.write.try_acquire) is None  # but no writer
    other.release()
    read.release()
    assert holds(r, name) == 0


def test_a_write_inside_the_only_read_is_an_upgrade(r: redis.Redis, name: str) -> None:
    rw = redlease.ReadWriteLock(r, name, ttl=TTL)
    with rw.read as read:
        with rw.write as write:
            assert write.fence > read.fence
            assert other_thread(rw.read.try_acquire) is None  # written: readers wait
        assert other_thread(rw.write.try_acquire) is None  # still read by us
    assert holds(r, name) == 0


def test_an_upgrade_other_readers_stand_in_the_way_of_is_refused(r: redis.Redis, name: str) -> None:
    rw = redlease.ReadWriteLock(r, name, ttl=TTL)
    theirs = other_thread(rw.read.try_acquire)
    assert isinstance(theirs, redlease.Lease)
    with rw.read:
        assert rw.write.try_acquire() is None  # busy: None, not an error
        started = time.monotonic()
        with pytest.raises(redlease.LockError, match="release the read lease first"):
            rw.write.acquire(timeout=TTL)
        assert time.monotonic() - started < TTL / 3  # refused at once, never waited
        assert queued(r, name) == 0  # and nothing left queued
    theirs.release()
    assert holds(r, name) == 0


def test_another_thread_is_another_holder(r: redis.Redis, name: str) -> None:
    rw = redlease.ReadWriteLock(r, name, ttl=TTL)
    with rw.write:
        assert other_thread(rw.read.try_acquire) is None
        refused = other_thread(lambda: rw.write.acquire(timeout=0.2))
        assert isinstance(refused, redlease.AcquireTimeout)


async def test_a_task_nests_reads_and_writes(ar: aredis.Redis, name: str) -> None:
    rw = redlease.AsyncReadWriteLock(ar, name, ttl=TTL)
    async with rw.read as outer, rw.read as inner:
        assert inner is outer
        assert outer.hold_count == 2
    async with rw.write as write:
        async with rw.write as again:
            assert again is write
        read = await rw.read.acquire(timeout=1)  # a downgrade
    assert not read.lost
    assert not read.released
    other = await asyncio.create_task(rw.read.try_acquire())  # another task may read
    assert other is not None
    assert await asyncio.create_task(rw.write.try_acquire()) is None
    await other.release()
    async with rw.write as upgraded:  # an upgrade: our read is the only lease
        assert upgraded.fence > read.fence
    await read.release()
    assert await ar.zcard(LockKeys.for_read_write(name).lock) == 0


async def test_a_tasks_upgrade_behind_other_readers_is_refused(ar: aredis.Redis, name: str) -> None:
    rw = redlease.AsyncReadWriteLock(ar, name, ttl=TTL)
    theirs = await asyncio.create_task(rw.read.acquire(timeout=1))
    async with rw.read:
        assert await rw.write.try_acquire() is None
        with pytest.raises(redlease.LockError, match="release the read lease first"):
            await rw.write.acquire(timeout=TTL)
    await theirs.release()


async def test_a_task_started_inside_a_write_is_another_holder(ar: aredis.Redis, name: str) -> None:
    rw = redlease.AsyncReadWriteLock(ar, name, ttl=TTL)
    async with rw.write:
        assert await asyncio.create_task(rw.read.try_acquire()) is None


@pytest.mark.parametrize("mode", ["read", "write"])
def test_a_lease_whose_release_failed_is_not_re_entered(
    binary: servers.ServerBinary, mode: str
) -> None:
    # The holder let go of it (its release raised): the next acquire is a new one, even
    # though the server may still hold the first until its ttl.
    with servers.ServerProcess(binary) as own:
        client = families.client(port=own.port)
        side = getattr(redlease.ReadWriteLock(client, "gone", ttl=TTL), mode)
        first = side.acquire(timeout=1)
        own.kill()
        with pytest.raises(redlease.BackendError):
            first.release()
        own.restart()  # without the data: the name is free
        again = side.acquire(timeout=5)
        assert again is not first
        assert again.fence > first.fence
        again.release()
        client.close()
