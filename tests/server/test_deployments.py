# mypy: disable-error-code="no-untyped-call"
# (redis-py leaves its cluster and sentinel helpers untyped)
"""The same lock on a Redis Cluster (scripts routed by the lock's hash tag) and behind
Sentinel (the client discovers the master), with real server processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

import families
import redlease
from conftest import SLOTS
from families import ClientFamily
from redlease._rules.keys import LockKeys
from redlease._sync.io import IO
from redlease._wire.endpoint import Route
from redlease.tools import servers
from waiting_helpers import lock_key


def wait_for(predicate: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_lock_on_a_cluster(cluster: list[servers.ServerProcess], family: ClientFamily) -> None:
    client = family.cluster(cluster[0].port)
    try:
        names = [f"job:{i}" for i in range(12)]  # spread over the three nodes' slots
        slots = {client.keyslot(lock_key(n)) // (SLOTS // 3) for n in names}
        assert len(slots) > 1
        for n in names:
            lock = redlease.Lock(client, n, ttl=5.0)
            with lock as lease:
                assert lease.fence >= 1
                assert lock.try_acquire() is None
                assert client.get(lock_key(n)) == lease.token.encode()
            again = lock.acquire(timeout=1)
            assert again.fence > lease.fence
            again.release()
    finally:
        client.close()


async def test_async_lock_on_a_cluster_from_the_first_call(
    cluster: list[servers.ServerProcess], family: ClientFamily
) -> None:
    """The asyncio cluster client from its very first acquire (the server check included),
    names spread over every node, and waiting there too."""
    client = family.acluster(cluster[0].port)
    try:
        for n in [f"ajob:{i}" for i in range(12)]:
            lock = redlease.AsyncLock(client, n, ttl=5.0)
            async with lock as lease:
                assert await lock.try_acquire() is None
                assert await client.get(lock_key(n)) == lease.token.encode()
            again = await lock.acquire(timeout=1)
            assert again.fence > lease.fence
            await again.release()
        lock = redlease.AsyncLock(client, "aqueue-on-cluster", ttl=10.0)
        holder = await lock.acquire()
        waiter = asyncio.ensure_future(lock.acquire(timeout=10))
        for _ in range(1000):  # until the waiter is queued
            if await client.llen(lock_key("aqueue-on-cluster") + ":line"):
                break
            await asyncio.sleep(0.01)
        await holder.release()
        handed = await waiter
        assert handed.fence > holder.fence
        await handed.release()
    finally:
        await client.aclose()


def test_waiting_on_a_cluster(cluster: list[servers.ServerProcess], family: ClientFamily) -> None:
    import threading

    client = family.cluster(cluster[0].port)
    try:
        lock = redlease.Lock(client, "queue-on-cluster", ttl=10.0)
        holder = lock.acquire()
        got: list[int] = []
        t = threading.Thread(target=lambda: got.append(lock.acquire(timeout=10).fence))
        t.start()
        wait_for(lambda: client.llen(lock_key("queue-on-cluster") + ":line") == 1, "the waiter")
        holder.release()
        t.join(timeout=10)
        assert len(got) == 1
        assert got[0] > holder.fence
    finally:
        client.close()


def test_semaphore_on_a_cluster(cluster: list[servers.ServerProcess], family: ClientFamily) -> None:
    """Every key of a semaphore in its name's slot (the release mark, built inside the
    script, too), on each node; and a waiter served there."""
    import threading

    client = family.cluster(cluster[0].port)
    try:
        names = [f"pool:{i}" for i in range(12)]
        slots = {client.keyslot(LockKeys.for_semaphore(n).lock) // (SLOTS // 3) for n in names}
        assert len(slots) > 1
        for n in names:
            sem = redlease.Semaphore(client, n, 2, ttl=5.0)
            first, second = sem.acquire(timeout=1), sem.acquire(timeout=1)
            assert sem.try_acquire() is None
            first.release()
            again = sem.acquire(timeout=1)
            assert again.fence > second.fence > first.fence
            second.release()
            again.release()
        sem = redlease.Semaphore(client, "queue-on-cluster", 1, ttl=10.0)
        holder = sem.acquire()
        got: list[int] = []
        t = threading.Thread(target=lambda: got.append(sem.acquire(timeout=10).fence))
        t.start()
        queue = LockKeys.for_semaphore("queue-on-cluster").queue
        wait_for(lambda: client.llen(queue) == 1, "the waiter")
        holder.release()
        t.join(timeout=10)
        assert len(got) == 1
        assert got[0] > holder.fence
    finally:
        client.close()


def test_read_write_lock_on_a_cluster(
    cluster: list[servers.ServerProcess], family: ClientFamily
) -> None:
    client = family.cluster(cluster[0].port)
    try:
        names = [f"doc:{i}" for i in range(12)]
        slots = {client.keyslot(LockKeys.for_read_write(n).lock) // (SLOTS // 3) for n in names}
        assert len(slots) > 1
        for n in names:
            holders = [redlease.ReadWriteLock(client, n, ttl=5.0) for _ in range(3)]
            reads = [rw.read.acquire(timeout=1) for rw in holders[:2]]
            assert holders[2].write.try_acquire() is None
            for lease in reads:
                lease.release()
            with holders[2].write as writer:
                assert writer.fence > max(lease.fence for lease in reads)
                assert holders[0].read.try_acquire() is None
    finally:
        client.close()


def test_election_on_a_cluster(cluster: list[servers.ServerProcess], family: ClientFamily) -> None:
    """Candidates, leader(), observers and their rings, on the node of each election's
    slot."""
    import threading

    client = family.cluster(cluster[0].port)
    try:
        names = [f"svc:{i}" for i in range(6)]
        slots = {client.keyslot(LockKeys.for_election(n).lock) // (SLOTS // 3) for n in names}
        assert len(slots) > 1
        for n in names:
            first = redlease.Election(client, n, ttl=5.0, identity="first")
            second = redlease.Election(client, n, ttl=5.0, identity="second")
            with second.observe() as changes:
                seen = [next(changes)]
                lease = first.campaign(timeout=1)
                seen.append(next(changes))
                got: list[Any] = []
                t = threading.Thread(
                    target=lambda e=second, got=got: got.append(e.campaign(timeout=10))
                )
                t.start()
                queue = LockKeys.for_election(n).queue
                wait_for(lambda q=queue: client.llen(q) == 1, "the candidate")
                first.resign()
                t.join(10)
                assert got[0].fence > lease.fence
                assert second.leader() == redlease.Leader("second", got[0].fence)
                second.resign()
            assert seen == [None, redlease.Leader("first", lease.fence)]
    finally:
        client.close()


@pytest.fixture
def sentinel(server_kind: str) -> Iterator[int]:
    binary = servers.find_binary(server_kind)
    master = servers.ServerProcess(binary).start()
    port = servers.free_port()
    workdir = master.workdir
    conf = os.path.join(workdir, "sentinel.conf")
    with open(conf, "w") as f:
        f.write(
            f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
            f"sentinel monitor main 127.0.0.1 {master.port} 1\n"
        )
    proc = subprocess.Popen(
        [binary.path, conf, "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        probe = families.client(port=port)

        def ready() -> bool:
            try:
                return bool(probe.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "main"))
            except families.errors().ConnectionError:
                return False

        wait_for(ready, "sentinel")
        probe.close()
        yield port
    finally:
        proc.kill()
        proc.wait(timeout=10)
        master.stop()


def test_lock_behind_sentinel(sentinel: int, family: ClientFamily) -> None:
    client = family.sentinel(sentinel).master_for("main")
    lock = redlease.Lock(client, "behind-sentinel", ttl=5.0)
    with lock as lease:
        assert lock.try_acquire() is None
        assert client.get(lock_key("behind-sentinel")) == lease.token.encode()
    assert client.exists(lock_key("behind-sentinel")) == 0
    client.close()


def test_semaphore_behind_sentinel(sentinel: int, family: ClientFamily) -> None:
    client = family.sentinel(sentinel).master_for("main")
    sem = redlease.Semaphore(client, "behind-sentinel", 2, ttl=5.0)
    with sem as first, sem as second:
        assert sem.try_acquire() is None
        assert client.zcard(LockKeys.for_semaphore("behind-sentinel").lock) == 2
        assert second.fence > first.fence
    assert client.exists(LockKeys.for_semaphore("behind-sentinel").lock) == 0
    client.close()


def test_lock_over_a_unix_socket(server_kind: str, name: str) -> None:
    """A Unix socket takes the drivers' lean path (and the sync driver's polling reads)
    as TCP does; sync and asyncio share the lock."""
    import asyncio

    proc = servers.ServerProcess(servers.find_binary(server_kind))
    path = os.path.join(proc.workdir, "redis.sock")
    proc.extra_args = ["--unixsocket", path, "--unixsocketperm", "700"]
    with proc:
        client = families.client(unix_socket_path=path)
        lock = redlease.Lock(client, name, ttl=5.0)
        fences = []
        for _ in range(20):
            with lock as lease:
                fences.append(lease.fence)
        pool = IO(client).pool
        assert pool is not None
        assert pool.endpoint.route is Route.SOCKET
        assert pool.endpoint.path == path

        async def from_asyncio() -> int:
            async_client = families.aclient(unix_socket_path=path)
            try:
                async with redlease.AsyncLock(async_client, name, ttl=5.0) as lease:
                    return lease.fence
            finally:
                await async_client.aclose()

        fences.append(asyncio.run(from_asyncio()))
        assert len(fences) == 21
        assert fences == sorted(set(fences))
        assert client.exists(lock_key(name)) == 0
        client.close()
