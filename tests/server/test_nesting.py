"""A nested ``with`` of a lock that is not reentrant, by the thread (asyncio: task) that
holds it through the enclosing block, is refused at once with a message naming
``reentrant=True``: it would otherwise wait for its own lease until the ttl ran out and
then take a lock that its outer block believes it still holds. Another thread or task is
another holder and waits as usual. Lock, AsyncLock, Redlock and AsyncRedlock, on real
servers."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import families
import redlease
from redlease.tools import servers
from waiting_helpers import lock_key

TTL = 30.0  # far longer than any refusal may take: waiting for itself would show


def test_a_nested_with_is_refused_at_once(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=TTL)
    with lock as outer:
        started = time.monotonic()
        with pytest.raises(redlease.LockError, match="reentrant=True"), lock:
            pass
        assert time.monotonic() - started < TTL / 3
        assert not outer.lost
        assert r.get(lock_key(name)) == outer.token.encode()  # the outer lease is untouched
    assert r.get(lock_key(name)) is None


def test_a_decorated_function_that_recurses_is_refused(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=TTL)

    @lock
    def countdown(n: int) -> int:
        return n if n == 0 else countdown(n - 1)

    with pytest.raises(redlease.LockError, match="reentrant=True"):
        countdown(1)
    assert r.get(lock_key(name)) is None  # the outer call's lease was released


def test_after_the_outer_lease_is_released_inside_a_nested_with_is_served(
    r: redis.Redis, name: str
) -> None:
    lock = redlease.Lock(r, name, ttl=TTL)
    with lock as outer:
        outer.release()
        with lock as inner:
            assert inner.fence > outer.fence
    assert r.get(lock_key(name)) is None


def test_another_thread_is_another_holder_and_waits(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=TTL)
    got: list[Any] = []

    def other() -> None:
        try:
            with lock.acquire(timeout=0.2):
                got.append("acquired")
        except BaseException as exc:
            got.append(exc)

    with lock:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(30)
    assert len(got) == 1
    assert isinstance(got[0], redlease.AcquireTimeout)


def test_a_reentrant_lock_still_nests(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=TTL, reentrant=True)
    with lock as outer, lock as inner:
        assert inner is outer
        assert outer.hold_count == 2


def test_a_semaphore_may_take_a_second_permit_in_a_nested_with(r: redis.Redis, name: str) -> None:
    sem = redlease.Semaphore(r, name, 2, ttl=TTL)
    with sem as first, sem as second:
        assert first.token != second.token


def test_a_nested_redlock_with_is_refused(r: redis.Redis, name: str) -> None:
    lock = redlease.Redlock([r], name, ttl=TTL)
    with lock, pytest.raises(redlease.LockError, match="reentrant=True"), lock:
        pass


async def test_a_nested_async_with_is_refused_at_once(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=TTL)
    async with lock as outer:
        with pytest.raises(redlease.LockError, match="reentrant=True"):
            async with lock:
                pass
        assert await ar.get(lock_key(name)) == outer.token.encode()
    assert await ar.get(lock_key(name)) is None


async def test_a_task_started_inside_the_block_is_another_holder(
    ar: aredis.Redis, name: str
) -> None:
    # A task copies its parent's context, the open blocks included; it is not their holder.
    lock = redlease.AsyncLock(ar, name, ttl=TTL)

    async def other() -> str:
        try:
            async with lock:
                return "acquired"
        except redlease.LockError as exc:
            return f"refused: {exc}"

    async with lock:
        task = asyncio.create_task(other())
        await asyncio.sleep(0.2)
        assert not task.done()  # waiting for the holder, not refused
    assert await asyncio.wait_for(task, 30) == "acquired"


async def test_a_nested_async_redlock_with_is_refused(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncRedlock([ar], name, ttl=TTL)
    async with lock:
        with pytest.raises(redlease.LockError, match="reentrant=True"):
            async with lock:
                pass


def test_a_reentrant_lease_whose_release_failed_is_not_re_entered(
    binary: servers.ServerBinary,
) -> None:
    # Its holder let go of it (the release raised): the next acquire is a new one.
    with servers.ServerProcess(binary) as own:
        client = families.client(port=own.port)
        lock = redlease.Lock(client, "gone", ttl=TTL, reentrant=True)
        first = lock.acquire(timeout=1)
        own.kill()
        with pytest.raises(redlease.BackendError):
            first.release()
        own.restart()  # without the data: the name is free
        again = lock.acquire(timeout=5)
        assert again is not first
        assert again.fence > first.fence
        again.release()
        client.close()
