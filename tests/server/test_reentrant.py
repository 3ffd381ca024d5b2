"""``reentrant=True``: a holder that acquires again gets the lease it holds, one hold
more, and only its last release reaches the server; other threads (tasks), a fork's
child, and a holder whose lease was lost get no such pass. Lock, AsyncLock, Redlock and
AsyncRedlock, on real servers."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import redlease
from redlease._rules.keys import LockKeys
from redlease.tools import servers
from waiting_helpers import lock_key, wait_until

NODE_DBS = (1, 2, 3)  # a Redlock's nodes: databases of the one server (distinct nodes)


def holder(r: redis.Redis, name: str) -> object:
    return r.get(lock_key(name))


@pytest.fixture
def nodes(server: servers.ServerProcess, r: redis.Redis) -> Iterator[list[redis.Redis]]:
    made = [redis.Redis(port=server.port, db=db) for db in NODE_DBS]
    for client in made:
        client.flushdb()
    yield made
    for client in made:
        client.close()


@pytest.fixture
async def anodes(server: servers.ServerProcess, r: redis.Redis) -> AsyncIterator[list[Any]]:
    made = [aredis.Redis(port=server.port, db=db) for db in NODE_DBS]
    yield made
    for client in made:
        await client.aclose()


def test_nested_with_returns_the_held_lease_and_releases_once(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, reentrant=True)
    with lock as outer:
        assert outer.hold_count == 1
        with lock as inner:
            assert inner is outer
            assert outer.hold_count == 2
            again = lock.try_acquire()  # try_acquire nests too
            assert again is outer
            assert outer.hold_count == 3
            again.release()
        assert outer.hold_count == 1
        assert holder(r, name) == outer.token.encode()  # the inner exits kept it
    assert outer.released
    assert outer.hold_count == 0
    assert holder(r, name) is None


def test_acquire_release_pairs_count_down_to_the_server(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, reentrant=True)
    first = lock.acquire(timeout=1)
    second = lock.acquire(timeout=1)
    assert second is first
    first.release()
    assert holder(r, name) == first.token.encode()
    assert not first.released
    second.release()
    assert first.released
    assert holder(r, name) is None
    first.release()  # released: a no-op, as for any lease
    fresh = lock.acquire(timeout=1)  # a new lease, not the old one
    assert fresh is not first
    assert fresh.fence > first.fence
    fresh.release()


def test_not_reentrant_by_default(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    with lock as lease:
        assert lock.try_acquire() is None
        with pytest.raises(redlease.AcquireTimeout):
            lock.acquire(timeout=0.1)
        assert lease.hold_count == 1


def test_another_thread_does_not_reenter(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, reentrant=True)
    seen: list[object] = []
    with lock as lease:
        thread = threading.Thread(target=lambda: seen.append(lock.try_acquire()))
        thread.start()
        thread.join(30)
        assert seen == [None]
        assert lease.hold_count == 1


def test_a_lost_lease_is_reported_once_then_taken_anew(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=0.2, reentrant=True)
    lease = lock.acquire(timeout=1)
    time.sleep(0.4)  # it runs out: nobody renews it
    with pytest.raises(redlease.LockLost, match="was lost"):
        lock.acquire(timeout=1)
    fresh = lock.acquire(timeout=1)
    assert fresh is not lease
    assert fresh.fence > lease.fence
    fresh.release()
    with pytest.raises(redlease.LockLost):
        lease.release()  # the old lease's own release says it was lost


def test_an_inner_release_of_a_lost_lease_says_so(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=0.2, reentrant=True)
    lease = lock.acquire(timeout=1)
    assert lock.acquire(timeout=1) is lease
    time.sleep(0.4)
    with pytest.raises(redlease.LockLost):
        lease.release()
    assert lease.hold_count == 0  # lost


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_reenter_its_parents_lease(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, reentrant=True)
    with lock as lease:
        pid = os.fork()
        if pid == 0:  # the child: the lock is busy, held by the parent
            os._exit(0 if lock.try_acquire() is None else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert lease.hold_count == 1
    assert holder(r, name) is None


def test_redlock_reenters(nodes: list[redis.Redis], name: str) -> None:
    lock = redlease.Redlock(nodes, name, ttl=30.0, reentrant=True)
    with lock as outer, lock as inner:
        assert inner is outer
        assert outer.hold_count == 2
    assert outer.released
    assert all(n.get(lock_key(name)) is None for n in nodes)


async def test_async_lock_reenters_per_task(ar: aredis.Redis, r: redis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0, reentrant=True)
    async with lock as outer:
        async with lock as inner:
            assert inner is outer
            assert outer.hold_count == 2
            # another task is another holder: it waits
            assert await asyncio.create_task(lock.try_acquire()) is None
        assert holder(r, name) == outer.token.encode()
    assert outer.released
    assert holder(r, name) is None


async def test_async_redlock_reenters(anodes: list[Any], name: str) -> None:
    lock = redlease.AsyncRedlock(anodes, name, ttl=30.0, reentrant=True)
    first = await lock.acquire(timeout=1)
    assert await lock.acquire(timeout=1) is first
    await first.release()
    assert not first.released
    await first.release()
    assert first.released


def test_reentrant_is_checked(r: redis.Redis, name: str) -> None:
    with pytest.raises(redlease.InvalidArgument, match="reentrant"):
        redlease.Lock(r, name, reentrant="yes")  # type: ignore[arg-type]


def test_a_blocks_hold_released_inside_it_is_not_released_again(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, reentrant=True)
    with lock as outer:
        with lock as inner:
            inner.release()  # early: the block's end must not take the outer hold too
        assert outer.hold_count == 1
        assert holder(r, name) == outer.token.encode()
    assert outer.released
    assert holder(r, name) is None


def test_a_holder_that_ends_without_releasing_is_not_kept(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, reentrant=True)
    leases: list[Any] = []
    thread = threading.Thread(target=lambda: leases.append(lock.acquire(timeout=1)))
    thread.start()
    thread.join(30)
    gone = weakref.ref(thread)
    del thread
    gc.collect()
    assert gone() is None  # the lock's table does not keep a finished thread alive
    leases[0].release()


def test_a_release_that_failed_lets_go_and_can_be_sent_again(server_kind: str, name: str) -> None:
    """The server is gone when the release is sent: its holder has let go of the lease
    all the same (its next acquire is a new one, never a re-entry into a lease that may no
    longer protect anything), and the release can be sent again once the server is back."""
    durable = ["--appendonly", "yes", "--appendfsync", "always"]  # the lock survives
    with servers.ServerProcess(servers.find_binary(server_kind), extra_args=durable) as own:
        client = redis.Redis(port=own.port)
        lock = redlease.Lock(client, name, ttl=30.0, reentrant=True)
        lease = lock.acquire(timeout=1)
        own.kill()
        with pytest.raises(redlease.BackendError):
            lease.release()
        own.restart()
        assert not lease.released  # the server still has it ...
        assert lock.try_acquire() is None  # ... so a new try finds it busy: not a re-entry
        lease.release()  # sent again: now it is released
        again = lock.acquire(timeout=1)
        assert again.fence > lease.fence
        again.release()
        client.close()


def test_a_renewed_lease_whose_release_failed_is_no_longer_renewed(
    server_kind: str, name: str
) -> None:
    """Its holder let go of it: the renewer stops, and what the server kept expires with
    the ttl instead of being renewed for good."""
    durable = ["--appendonly", "yes", "--appendfsync", "always"]
    with servers.ServerProcess(servers.find_binary(server_kind), extra_args=durable) as own:
        client = redis.Redis(port=own.port)
        # ttl: room for the kill, the failed release and a restart on a loaded machine
        lock = redlease.Lock(client, name, ttl=10.0, reentrant=True, auto_renew=True)
        lease = lock.acquire(timeout=1)
        own.kill()
        with pytest.raises(redlease.BackendError):
            lease.release()
        own.restart()
        key = LockKeys.for_name(name).lock
        assert client.exists(key) == 1  # kept by the server ...
        wait_until(lambda: client.exists(key) == 0, timeout=30)  # ... until its ttl
        client.close()
