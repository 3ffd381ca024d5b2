"""``read_info`` and ``aread_info`` on real servers: a free name, a held lock with its
time left and fence counter, live and dead waiters told apart by the server's clock, a
semaphore's permits, a read/write lock's readers and writer, an election's leader; one
read-only script (nothing written, nothing cleaned up); arguments checked."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import redlease
from redlease import Holder, LockInfo, aread_info, read_info
from redlease._rules.flows import as_text
from redlease._rules.keys import LockKeys
from redlease.tools import servers
from waiting_helpers import in_thread, wait_until


def keys_under(r: redis.Redis, keys: LockKeys) -> dict[bytes, Any]:
    """Every key of one name, with its content: to show a read changed none."""
    readers: dict[str, Callable[[bytes], Any]] = {
        "string": r.get,
        "list": lambda k: r.lrange(k, 0, -1),
        "hash": r.hgetall,
        "zset": lambda k: r.zrange(k, 0, -1, withscores=True),
    }
    found: dict[bytes, Any] = {}
    for key in r.scan_iter(match=keys.lock.replace("{", "[{]") + "*"):
        found[key] = readers[as_text(r.type(key))](key)
    return found


def test_a_free_name_reads_empty_and_creates_nothing(r: redis.Redis, name: str) -> None:
    for kind in ("lock", "semaphore", "rwlock", "election"):
        info = read_info(r, name, kind=kind)
        assert info == LockInfo(name=name, kind=kind, holders=(), fence=None, waiters=())
        assert not info.held
        assert info.live_waiters == 0
    assert list(r.scan_iter(match="*" + name + "*")) == []


def test_a_held_lock_its_time_left_and_fence(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    lease = lock.acquire(timeout=1)
    info = read_info(r, name)
    assert info.held
    assert info.kind == "lock"
    (holder,) = info.holders
    assert holder.token == lease.token
    assert holder.mode == "exclusive"
    assert holder.fence == lease.fence  # one holder at a time: the counter's last value
    assert holder.remaining is not None
    assert 20.0 < holder.remaining <= 30.0
    assert info.fence == lease.fence
    assert info.waiters == ()
    lease.release()
    after = read_info(r, name)
    assert not after.held
    assert after.fence == lease.fence  # the counter outlives the lease


def test_a_key_without_ttl_reads_as_none(r: redis.Redis, name: str) -> None:
    r.set(LockKeys.for_name(name).lock, "someone")  # (not redlease's doing: it sets a TTL)
    assert read_info(r, name).holders == (Holder("someone", None, "exclusive", None),)


def test_live_and_dead_waiters_told_apart(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    keys = LockKeys.for_name(name)
    lease = redlease.Lock(r, name, ttl=30.0).acquire(timeout=1)
    # A waiter killed while queued: its entry (ttl 30 s, so good for about 31 s) stays in
    # the queue until a grant meets it, but it is dead as soon as the server has seen its
    # connection close: its hub is gone with it.
    code = textwrap.dedent(f"""
        import redis, redlease
        r = redis.Redis.from_url({server.url!r})
        redlease.Lock(r, {name!r}, ttl=30.0).acquire(timeout=60)
    """)
    dead = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_until(lambda: r.llen(keys.queue) == 1, timeout=60)
    finally:
        dead.kill()
        dead.wait(30)
    waiter = redlease.Lock(r, name, ttl=30.0)
    thread, got = in_thread(lambda: waiter.acquire(timeout=120))
    try:
        wait_until(lambda: r.llen(keys.queue) == 2, timeout=60)
        wait_until(lambda: not read_info(r, name).waiters[0].live, timeout=10)
        before = keys_under(r, keys)
        info = read_info(r, name)
        assert keys_under(r, keys) == before  # read only: the dead entry is still there
        queued = [as_text(t).split("|")[0] for t in r.lrange(keys.queue, 0, -1)]
        assert [w.token for w in info.waiters] == queued  # in queue order
        gone, alive = info.waiters
        assert not gone.live
        assert gone.remaining > 10.0  # dead long before its deadline: its hub is gone
        assert alive.live
        assert 10.0 < alive.remaining < 40.0
        assert info.live_waiters == 1
    finally:
        lease.release()
        thread.join(60)
    assert isinstance(got[0], redlease.Lease)
    got[0].release()


async def test_aread_info_sees_an_async_holder_and_waiter(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0)
    lease = await lock.acquire(timeout=1)
    waiting = asyncio.create_task(lock.acquire(timeout=60))
    try:

        async def live() -> int:
            return (await aread_info(ar, name)).live_waiters

        for _ in range(4000):
            if await live():
                break
            await asyncio.sleep(0.005)
        info = await aread_info(ar, name)
        assert [h.token for h in info.holders] == [lease.token]
        assert info.fence == lease.fence
        assert len(info.waiters) == 1
        assert info.live_waiters == 1
    finally:
        await lease.release()
        second = await asyncio.wait_for(waiting, 60)
    assert [h.token for h in (await aread_info(ar, name)).holders] == [second.token]
    await second.release()


def test_a_semaphore_two_permits_and_one_run_out(r: redis.Redis, name: str) -> None:
    sem = redlease.Semaphore(r, name, 3, ttl=30.0)
    permits = [sem.acquire(timeout=1) for _ in range(2)]
    short = redlease.Semaphore(r, name, 3, ttl=0.2).acquire(timeout=1)
    info = read_info(r, name, kind="semaphore")
    assert len(info.holders) == 3
    time.sleep(0.5)  # the short permit runs out; nothing has dropped it from the server
    keys = LockKeys.for_semaphore(name)
    assert r.zscore(keys.lock, short.token) is not None
    info = read_info(r, name, kind="semaphore")
    assert r.zscore(keys.lock, short.token) is not None  # still: the read wrote nothing
    assert info.kind == "semaphore"
    assert {h.token: h.fence for h in info.holders} == {p.token: p.fence for p in permits}
    for holder in info.holders:
        assert holder.mode == "shared"
        assert holder.remaining is not None
        assert 20.0 < holder.remaining <= 30.0
    assert info.fence == short.fence  # the last fence taken
    # A lock of the same name is another thing: free.
    assert not read_info(r, name).held
    for permit in permits:
        permit.release()


def test_a_read_write_lock_readers_then_a_writer(r: redis.Redis, name: str) -> None:
    rw = redlease.ReadWriteLock(r, name, ttl=30.0)
    other = redlease.ReadWriteLock(r, name, ttl=30.0)
    reads = [rw.read.acquire(timeout=1)]
    thread, out = in_thread(lambda: other.read.acquire(timeout=1))
    thread.join(30)
    reads.append(out[0])
    writer = redlease.ReadWriteLock(r, name, ttl=30.0)
    thread, got = in_thread(lambda: writer.write.acquire(timeout=120))
    wait_until(lambda: read_info(r, name, kind="rwlock").live_waiters == 1, timeout=60)
    info = read_info(r, name, kind="rwlock")
    assert {(h.token, h.mode, h.fence) for h in info.holders} == {
        (lease.token, "shared", lease.fence) for lease in reads
    }
    reads[0].release()
    thread2, _ = in_thread(reads[1].release)
    thread2.join(30)
    thread.join(60)
    write = got[0]
    info = read_info(r, name, kind="rwlock")
    assert info.holders == (
        Holder(write.token, info.holders[0].remaining, "exclusive", write.fence),
    )
    assert info.fence == write.fence
    assert info.waiters == ()
    write.release()


def test_an_election_leader_and_a_candidate(r: redis.Redis, name: str) -> None:
    alpha = redlease.Election(r, name, ttl=30.0, identity="alpha")
    beta = redlease.Election(r, name, ttl=30.0, identity="beta")
    lease = alpha.campaign(timeout=1)
    thread, got = in_thread(lambda: beta.campaign(timeout=120))
    wait_until(lambda: read_info(r, name, kind="election").live_waiters == 1, timeout=60)
    info = read_info(r, name, kind="election")
    assert [(h.token, h.mode) for h in info.holders] == [(lease.token, "exclusive")]
    assert info.fence == lease.fence  # the term
    assert not read_info(r, name).held  # the lock of that name is not the election
    alpha.resign()
    thread.join(60)
    assert [h.token for h in read_info(r, name, kind="election").holders] == [got[0].token]
    beta.resign()


def test_another_prefix(r: redis.Redis, name: str) -> None:
    lease = redlease.Lock(r, name, ttl=30.0, prefix="app:").acquire(timeout=1)
    assert not read_info(r, name).held
    assert read_info(r, name, prefix="app:").holders[0].token == lease.token
    lease.release()


async def test_bad_arguments_are_named(r: redis.Redis, ar: aredis.Redis, name: str) -> None:
    with pytest.raises(redlease.InvalidArgument, match="kind must be one of"):
        read_info(r, name, kind="mutex")
    with pytest.raises(redlease.InvalidArgument, match="kind"):
        await aread_info(ar, name, kind=None)  # type: ignore[arg-type]
    with pytest.raises(redlease.InvalidArgument, match="name"):
        read_info(r, "")
    with pytest.raises(redlease.InvalidArgument, match="prefix"):
        read_info(r, name, prefix="a{b")
    with pytest.raises(redlease.InvalidArgument, match="aread_info"):
        read_info(ar, name)
    with pytest.raises(redlease.InvalidArgument, match="read_info"):
        await aread_info(r, name)
    with pytest.raises(redlease.InvalidArgument, match="client"):
        read_info(object(), name)
