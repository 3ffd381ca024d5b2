"""``ReadWriteLock`` and ``AsyncReadWriteLock`` on real servers: many readers or one
writer; arrival order, so a waiting writer holds back later readers and is not starved;
a writer's fence above every earlier lease's (nesting by one holder:
test_rwlock_nesting); dead and cancelled holders; keys apart and with TTLs; and
the invariant across processes sharing a resource."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import redlease
from redlease._rules.keys import LockKeys, forgotten_within
from redlease.tools import servers
from waiting_helpers import in_thread, until_queued, wait_until


def keys_of(name: str) -> LockKeys:
    return LockKeys.for_read_write(name)


def queued(r: redis.Redis, name: str) -> int:
    return int(r.llen(keys_of(name).queue))


def rw_keys(r: redis.Redis, name: str) -> list[bytes]:
    return list(r.scan_iter(match=keys_of(name).lock.replace("{", "[{]") + "*"))


def test_many_readers_or_one_writer(twin: Any, name: str) -> None:
    holders = [twin.rwlock(name, ttl=30.0) for _ in range(4)]  # four holders
    reads = [h.read.acquire(timeout=1) for h in holders[:3]]
    assert len({lease.token for lease in reads}) == 3
    assert holders[3].write.try_acquire() is None
    with pytest.raises(redlease.AcquireTimeout, match="write side"):
        holders[3].write.acquire(timeout=0.1)
    for lease in reads:
        lease.release()
    writer = holders[3].write.acquire(timeout=1)
    assert writer.fence > max(lease.fence for lease in reads)
    assert holders[0].read.try_acquire() is None
    assert holders[1].write.try_acquire() is None
    writer.extend(20.0)
    writer.release()
    with holders[0].read as lease:
        assert lease.fence > writer.fence


def test_a_waiting_writer_holds_back_later_readers(twin: Any, r: redis.Redis, name: str) -> None:
    first, writing, later = (twin.rwlock(name, ttl=30.0) for _ in range(3))
    reader = first.read.acquire(timeout=1)
    writer_thread, wrote = in_thread(lambda: writing.write.acquire(timeout=60))
    wait_until(lambda: queued(r, name) == 1)
    assert later.read.try_acquire() is None  # not past the writer, although readers hold
    reader_thread, read = in_thread(lambda: later.read.acquire(timeout=60))
    wait_until(lambda: queued(r, name) == 2)
    reader.release()
    writer_thread.join(60)
    writer = wrote[0]
    assert writer.fence > reader.fence
    assert queued(r, name) == 1  # the later reader still waits for the writer
    writer.release()
    reader_thread.join(60)
    assert read[0].fence > writer.fence
    read[0].release()


def test_readers_queued_together_are_let_in_together(twin: Any, r: redis.Redis, name: str) -> None:
    writing = twin.rwlock(name, ttl=30.0)
    writer = writing.write.acquire(timeout=1)
    readers = [in_thread(lambda: twin.rwlock(name, ttl=30.0).read.acquire(timeout=60))]
    wait_until(lambda: queued(r, name) == 1)
    readers += [in_thread(lambda: twin.rwlock(name, ttl=30.0).read.acquire(timeout=60))]
    wait_until(lambda: queued(r, name) == 2)
    writer.release()
    leases = []
    for thread, out in readers:
        thread.join(60)
        leases.append(out[0])
    assert all(lease.remaining() > 0 for lease in leases)  # both at once
    assert r.zcard(keys_of(name).lock) == 2
    for lease in leases:
        lease.release()


def test_a_dead_writers_lease_runs_out(twin: Any, name: str) -> None:
    abandoned = twin.rwlock(name, ttl=0.3).write.acquire(timeout=1)  # never released
    started = time.monotonic()
    lease = twin.rwlock(name, ttl=30.0).read.acquire(timeout=20)
    assert time.monotonic() - started < 15
    assert lease.fence > abandoned.fence
    lease.release()


async def test_a_cancelled_writer_lets_the_readers_behind_it_in(
    ar: aredis.Redis, r: redis.Redis, name: str
) -> None:
    rw = redlease.AsyncReadWriteLock(ar, name, ttl=30.0)
    reader = await rw.read.acquire(timeout=1)
    writer = asyncio.create_task(rw.write.acquire(timeout=60))
    await until_queued(lambda: queued(r, name))
    later = asyncio.create_task(rw.read.acquire(timeout=60))
    await until_queued(lambda: queued(r, name) == 2)
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    lease = await asyncio.wait_for(later, 30)  # in at once, beside the first reader
    assert reader.remaining() > 0
    await lease.release()
    await reader.release()
    assert r.zcard(keys_of(name).lock) == 0


def test_keys_have_ttls_and_stand_apart(twin: Any, r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    sem = redlease.Semaphore(r, name, 1, ttl=30.0)
    with lock, sem:
        rw = twin.rwlock(name, ttl=0.5)
        writer = rw.write.acquire(timeout=1)
        thread, _ = in_thread(lambda: twin.rwlock(name, ttl=0.5).read.acquire(timeout=10))
        wait_until(lambda: queued(r, name) == 1)
        keys = rw_keys(r, name)
        assert len(keys) >= 4  # holders, fences, counter, queue
        assert all(r.pttl(k) > 0 for k in keys), {k: r.pttl(k) for k in keys}
        writer.release()
        thread.join(30)
        time.sleep(forgotten_within(500) / 1000 + 0.2)
        assert rw_keys(r, name) == []


def test_bad_arguments_are_named(r: redis.Redis, ar: aredis.Redis, name: str) -> None:
    with pytest.raises(redlease.InvalidArgument, match="ttl"):
        redlease.ReadWriteLock(r, name, ttl=-1)
    with pytest.raises(redlease.InvalidArgument, match="max_hold"):
        redlease.ReadWriteLock(r, name, max_hold=5)
    with pytest.raises(redlease.InvalidArgument, match="prefix"):
        redlease.ReadWriteLock(r, name, prefix="{x}")
    with pytest.raises(redlease.InvalidArgument, match="AsyncReadWriteLock"):
        redlease.AsyncReadWriteLock(r, name)
    with pytest.raises(redlease.InvalidArgument, match="cancel_on_lost"):
        redlease.AsyncReadWriteLock(ar, name, cancel_on_lost=1)  # type: ignore[arg-type]
    with pytest.raises(redlease.InvalidArgument, match="timeout"):
        redlease.ReadWriteLock(r, name).read.acquire(timeout=-1)


_WORKER = """
import json, random, sys, time, redis, redlease
port, name, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
r = redis.Redis(port=port)
rw = redlease.ReadWriteLock(r, name, ttl=10.0)
bad, reads, writes, together = 0, 0, 0, 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    writing = random.random() < 0.2
    with (rw.write if writing else rw.read).acquire(timeout=60):
        pipe = r.pipeline()
        pipe.incr(name + (":writers" if writing else ":readers"))
        pipe.get(name + (":readers" if writing else ":writers"))
        mine, others = pipe.execute()
        others = int(others or 0)
        bad += (mine > 1 or others > 0) if writing else others > 0
        together = max(together, 0 if writing else mine)
        time.sleep(0.002)
        r.decr(name + (":writers" if writing else ":readers"))
    reads, writes = reads + (not writing), writes + writing
print(json.dumps({"bad": bad, "reads": reads, "writes": writes, "together": together}))
"""


def test_processes_never_see_a_writer_with_anyone_else(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(server.port), name, "3"], stdout=subprocess.PIPE
        )
        for _ in range(6)
    ]
    results = [json.loads(w.communicate(timeout=120)[0]) for w in workers]
    assert all(w.returncode == 0 for w in workers)
    assert sum(res["bad"] for res in results) == 0
    assert sum(res["writes"] for res in results) > 0
    assert max(res["together"] for res in results) >= 2  # readers did share: it can fail
