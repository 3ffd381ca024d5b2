"""A Sentinel failover while a lease is held and waiters wait: the master killed with -9,
and a graceful ``SENTINEL FAILOVER``. Waiters with time left get the lock from the new
master without an error surfacing; the holder's lease is reported lost or survives."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import families
import redlease
from families import ClientFamily
from redlease.tools import servers

pytestmark = pytest.mark.slow

WAITERS = 3
WAIT = 30.0  # the waiters' timeout: far longer than a failover takes here


@dataclass
class Deployment:
    master: servers.ServerProcess
    replica: servers.ServerProcess
    sentinel_port: int

    def master_port(self) -> int:
        with families.client(port=self.sentinel_port) as probe:
            _host, port = probe.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "main")
        return int(port)

    def wait_for_new_master(self, old: int, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.master_port()
            if port != old:
                with families.client(port=port) as probe:
                    if probe.info("replication")["role"] == "master":
                        return port
            time.sleep(0.05)
        raise AssertionError("no failover happened")


@pytest.fixture
def deployment(server_kind: str) -> Iterator[Deployment]:
    binary = servers.find_binary(server_kind)
    master = servers.ServerProcess(binary).start()
    replica = servers.ServerProcess(
        binary, extra_args=["--replicaof", "127.0.0.1", str(master.port)]
    ).start()
    port = servers.free_port()
    conf = os.path.join(master.workdir, "sentinel.conf")
    with open(conf, "w") as f:
        f.write(
            f"port {port}\nbind 127.0.0.1\ndir {master.workdir}\n"
            f"sentinel monitor main 127.0.0.1 {master.port} 1\n"
            "sentinel down-after-milliseconds main 400\n"
            "sentinel failover-timeout main 3000\n"
        )
    proc = subprocess.Popen(
        [binary.path, conf, "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        with families.client(port=master.port) as client:
            client.set("sync-probe", 1)
            assert client.wait(1, 10_000) == 1
        deadline = time.monotonic() + 30
        while True:  # the sentinel has found the replica: a failover can promote it
            try:
                with families.client(port=port) as probe:
                    if probe.execute_command("SENTINEL", "REPLICAS", "main"):
                        break
            except families.errors().ConnectionError:
                pass
            assert time.monotonic() < deadline, "sentinel did not start"
            time.sleep(0.05)
        yield Deployment(master, replica, port)
    finally:
        proc.kill()
        proc.wait(timeout=10)
        replica.stop()
        master.stop()


def _fail_over(deployment: Deployment, how: str) -> None:
    if how == "kill":
        deployment.master.kill()
    else:
        with families.client(port=deployment.sentinel_port) as probe:
            probe.execute_command("SENTINEL", "FAILOVER", "main")


@pytest.mark.parametrize("how", ["kill", "sentinel_failover"])
def test_waiters_get_the_lock_from_the_new_master(
    deployment: Deployment, how: str, family: ClientFamily
) -> None:
    sentinel = family.sentinel(deployment.sentinel_port)
    client = sentinel.master_for("main")
    lock = redlease.Lock(client, "failover", ttl=2.0)
    holder = lock.acquire(timeout=5)
    got: list[int] = []
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            lease = lock.acquire(timeout=WAIT)
            got.append(lease.fence)
            lease.release()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wait) for _ in range(WAITERS)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # the waiters are queued and blocked on the old master
    old = deployment.master.port
    _fail_over(deployment, how)
    deployment.wait_for_new_master(old)
    for t in threads:
        t.join(timeout=WAIT + 10)
    assert errors == []
    assert len(got) == WAITERS
    with contextlib.suppress(redlease.LockLost):  # lost, or it survived: nothing else
        holder.release()
    client.close()
    for connection in sentinel.sentinels:
        connection.close()


@pytest.mark.parametrize("how", ["kill", "sentinel_failover"])
async def test_async_waiters_get_the_lock_from_the_new_master(
    deployment: Deployment, how: str, family: ClientFamily
) -> None:
    sentinel = family.asentinel(deployment.sentinel_port)
    client = sentinel.master_for("main")
    lock = redlease.AsyncLock(client, "failover", ttl=2.0)
    holder = await lock.acquire(timeout=5)

    async def wait() -> int:
        lease = await lock.acquire(timeout=WAIT)
        await lease.release()
        return lease.fence

    waiters = [asyncio.ensure_future(wait()) for _ in range(WAITERS)]
    await asyncio.sleep(0.3)
    old = deployment.master.port
    _fail_over(deployment, how)
    await asyncio.to_thread(deployment.wait_for_new_master, old)
    fences = await asyncio.gather(*waiters)
    assert len(fences) == WAITERS
    with contextlib.suppress(redlease.LockLost):
        await holder.release()
    await client.aclose()
    for connection in sentinel.sentinels:  # the sentinel's own clients
        await connection.aclose()
