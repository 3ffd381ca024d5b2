"""The contract through every client family redlease serves, on both server kinds: the
first acquire on a server that has not seen the scripts, a server that is down, a bounded
pool with more waiters than slots, auto-renewal, Redlock, and the families refused by name.

(The rest of the suite runs each server kind through one family: see ``families``.)
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import redlease
from families import FAMILIES, ClientFamily
from redlease import _clients
from redlease.tools import servers
from waiting_helpers import lock_key, wait_until


@pytest.fixture(params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> ClientFamily:
    return FAMILIES[request.param]


@pytest.fixture
def client(family: ClientFamily, server: servers.ServerProcess) -> Iterator[Any]:
    made = family.client(port=server.port)
    made.flushall()
    yield made
    made.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _nothing_held(client: Any, name: str) -> None:
    """The lock is free, and whatever it left expires (but the fence counter, kept on
    purpose: see docs/guarantees.md)."""
    assert client.exists(lock_key(name)) == 0
    for key in client.keys(lock_key(name) + "*"):
        assert key.endswith(b":fence") or client.pttl(key) > 0, key


def test_every_family_is_recognised(family: ClientFamily) -> None:
    known = _clients.family_of(family.client(port=1))
    assert known is not None
    assert known.name == family.name


def test_first_acquire_after_script_flush(client: Any, family: ClientFamily, name: str) -> None:
    """A server that has not seen redlease's scripts (fresh, restarted, failed over)."""
    for _ in range(2):
        client.script_flush()
        with redlease.Lock(client, name, ttl=5.0) as lease:
            assert lease.fence >= 1
            client.script_flush()
        assert client.exists(lock_key(name)) == 0


async def test_async_first_acquire_after_script_flush(
    family: ClientFamily, server: servers.ServerProcess, name: str
) -> None:
    made = family.aclient(port=server.port)
    try:
        await made.script_flush()
        async with redlease.AsyncLock(made, name, ttl=5.0) as lease:
            assert lease.fence >= 1
            await made.script_flush()
        assert await made.exists(lock_key(name)) == 0
    finally:
        await made.aclose()


def test_server_down_is_a_backend_error(family: ClientFamily, name: str) -> None:
    down = family.client(port=_free_port(), socket_connect_timeout=0.5)
    with pytest.raises(redlease.BackendError, match="cannot be reached") as caught:
        redlease.Lock(down, name).try_acquire()
    assert isinstance(caught.value.__cause__, family.exceptions.ConnectionError)
    with pytest.raises(redlease.QuorumError):
        redlease.Redlock([down], name).try_acquire()


async def test_async_server_down_is_a_backend_error(family: ClientFamily, name: str) -> None:
    down = family.aclient(port=_free_port(), socket_connect_timeout=0.5)
    with pytest.raises(redlease.BackendError, match="cannot be reached"):
        await redlease.AsyncLock(down, name).try_acquire()
    await down.aclose()


def test_waiters_leave_a_bounded_pool_alone(
    family: ClientFamily, server: servers.ServerProcess, name: str
) -> None:
    """20 threads wait for one lock through a client whose pool has 5 slots: the holder
    releases, the application's own commands run, every waiter gets the lock in turn and
    no key is left behind."""
    pool = family.pool(port=server.port, max_connections=5)
    client = family.client(connection_pool=pool)
    lock = redlease.Lock(client, name, ttl=10.0)
    fences: list[int] = []
    failures: list[str] = []

    def waiter() -> None:
        try:
            with lock.acquire(timeout=20.0) as lease:
                fences.append(lease.fence)
        except Exception as exc:  # collected: the assertion names them
            failures.append(repr(exc))

    threads = [threading.Thread(target=waiter) for _ in range(20)]
    try:
        holder = lock.acquire(timeout=2.0)
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # the waiters are blocked on the server now
        client.set(f"{name}:app", "still served")
        assert client.get(f"{name}:app") == b"still served"
        holder.release()
        for thread in threads:
            thread.join(30)
        assert failures == []
        assert len(fences) == 20
        assert fences == sorted(set(fences))
        _nothing_held(client, name)
    finally:
        for thread in threads:
            if thread.ident is not None:
                thread.join(30)
        client.close()
        pool.disconnect()


async def test_async_waiters_leave_a_bounded_pool_alone(
    family: ClientFamily, server: servers.ServerProcess, name: str
) -> None:
    client = family.aclient(port=server.port, max_connections=5)
    lock = redlease.AsyncLock(client, name, ttl=10.0)
    fences: list[int] = []

    async def waiter() -> None:
        async with await lock.acquire(timeout=20.0) as lease:
            fences.append(lease.fence)

    try:
        holder = await lock.acquire(timeout=2.0)
        tasks = [asyncio.create_task(waiter()) for _ in range(20)]
        await asyncio.sleep(0.5)
        await client.set(f"{name}:app", "still served")
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert len(fences) == 20
        assert fences == sorted(set(fences))
        assert await client.exists(lock_key(name)) == 0
        for key in await client.keys(lock_key(name) + "*"):
            assert key.endswith(b":fence") or await client.pttl(key) > 0, key
    finally:
        await client.aclose()


def test_auto_renew_and_takeover(client: Any, name: str) -> None:
    lost = threading.Event()
    lease = redlease.Lock(client, name, ttl=0.6, auto_renew=True, on_lost=lambda _: lost.set())
    held = lease.acquire()
    time.sleep(1.0)  # past the ttl: renewed through this family's client
    assert not held.lost
    client.set(lock_key(name), "another holder", px=60_000)
    assert lost.wait(2.0)


def test_redlock_through_the_family(family: ClientFamily, server_kind: str, name: str) -> None:
    with servers.running(3, server_kind) as nodes:
        made = [family.client(port=node.port) for node in nodes]
        with redlease.Redlock(made, name, ttl=5.0) as lease:
            assert lease.fence >= 1
            assert [c.exists(lock_key(name)) for c in made] == [1, 1, 1]
        # the release returns once a majority confirmed; the last node follows at once
        wait_until(lambda: [c.exists(lock_key(name)) for c in made] == [0, 0, 0])
        nodes[0].stop()
        with redlease.Redlock(made, name, ttl=5.0) as lease:  # 2 of 3 still a majority
            assert lease.fence >= 1


# -- clients of libraries redlease does not serve are refused by name ------------------------


# (a coredis cluster client made and dropped unused leaves anyio streams unclosed)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_coredis_beyond_standalone_is_refused_by_name() -> None:
    coredis = pytest.importorskip("coredis")
    cluster = coredis.RedisCluster(host="127.0.0.1", port=_free_port())
    with pytest.raises(redlease.InvalidArgument, match=r"client is refused: coredis\.\S*Cluster"):
        redlease.AsyncLock(cluster, "x")
    with pytest.raises(redlease.InvalidArgument, match=r"nodes\[0\] is refused: coredis"):
        redlease.AsyncRedlock([cluster], "x")
    with pytest.raises(redlease.InvalidArgument, match="sync client"):
        redlease.Lock(coredis.Redis(port=_free_port()), "x")  # coredis is asyncio only


def test_redlock_knows_a_coredis_node_by_its_address() -> None:
    """Two coredis clients of one server are one node, refused as for redis-py, and a
    node is named by its address (its family reads the settings, not redlease)."""
    coredis = pytest.importorskip("coredis")
    port = _free_port()
    with pytest.raises(redlease.InvalidArgument, match=rf"same node \(127.0.0.1:{port}/0\)"):
        redlease.AsyncRedlock(
            [
                coredis.Redis(host="127.0.0.1", port=port),
                coredis.Redis(host="127.0.0.1", port=port),
            ],
            "x",
        )


async def test_coredis_contract(server: servers.ServerProcess, name: str) -> None:
    """A standalone coredis client: the first acquire on a server without the scripts,
    waiters beyond its pool's slots while the application uses it, auto-renewal, a server
    that is down, AsyncRedlock."""
    coredis = pytest.importorskip("coredis")
    admin = FAMILIES["redis-py"].client(port=server.port)
    client = coredis.Redis(host="127.0.0.1", port=server.port, max_connections=5)
    try:
        admin.script_flush()
        lock = redlease.AsyncLock(client, name, ttl=10.0)
        fences: list[int] = []

        async def waiter() -> None:
            async with await lock.acquire(timeout=20.0) as lease:
                fences.append(lease.fence)

        async with client:
            holder = await lock.acquire(timeout=2.0)
            tasks = [asyncio.create_task(waiter()) for _ in range(20)]
            await asyncio.sleep(0.5)
            await client.set(f"{name}:app", "still served")
            await holder.release()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert len(fences) == 20
        assert fences == sorted(set(fences))
        _nothing_held(admin, name)
        renewed = await redlease.AsyncLock(client, f"{name}:r", ttl=0.6, auto_renew=True).acquire()
        await asyncio.sleep(1.0)
        assert not renewed.lost
        await renewed.release()
        async with redlease.AsyncRedlock([client], f"{name}:rl", ttl=5.0) as lease:
            assert lease.fence >= 1
        down = coredis.Redis(host="127.0.0.1", port=_free_port())
        with pytest.raises(redlease.BackendError, match="cannot be reached"):
            await redlease.AsyncLock(down, name).try_acquire()
    finally:
        admin.close()


def test_glide_is_refused_by_name(server: servers.ServerProcess) -> None:
    glide_sync = pytest.importorskip("glide_sync")
    config = glide_sync.GlideClientConfiguration([glide_sync.NodeAddress("127.0.0.1", server.port)])
    client = glide_sync.GlideClient.create(config)
    try:
        for make in (redlease.Lock, redlease.AsyncLock):
            with pytest.raises(redlease.InvalidArgument, match=r"client is refused: glide_sync"):
                make(client, "x")
    finally:
        client.close()


async def test_async_glide_is_refused_by_name(server: servers.ServerProcess) -> None:
    glide = pytest.importorskip("glide")
    config = glide.GlideClientConfiguration([glide.NodeAddress("127.0.0.1", server.port)])
    client = await glide.GlideClient.create(config)
    try:
        with pytest.raises(redlease.InvalidArgument, match=r"client is refused: glide\.\S*Glide"):
            redlease.AsyncLock(client, "x")
        with pytest.raises(redlease.InvalidArgument, match=r"nodes\[0\] is refused: glide"):
            redlease.AsyncRedlock([client], "x")
    finally:
        await client.close()


def test_redlock_over_nodes_of_both_families(server_kind: str, name: str) -> None:
    with servers.running(3, server_kind) as nodes:
        made = [
            FAMILIES[family].client(port=node.port)
            for family, node in zip(["redis-py", "valkey-py", "redis-py"], nodes, strict=True)
        ]
        lock = redlease.Redlock(made, name, ttl=5.0)
        with lock as lease:
            assert [c.exists(lock_key(name)) for c in made] == [1, 1, 1]
            assert lock.try_acquire() is None
        again = lock.acquire(timeout=1.0)
        assert again.fence > lease.fence
        again.release()


def test_cli_takes_a_valkey_url(
    server: servers.ServerProcess, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`valkey://` asks for a valkey-py client; `redis://` for redis-py; others are refused."""
    from redlease._cli.command import main

    url = f"valkey://127.0.0.1:{server.port}/0"
    assert _clients.from_url(url).__class__.__module__.startswith("valkey")
    assert _clients.from_url(server.url).__class__.__module__.startswith("redis")
    probe = "import sys; sys.exit(0)"
    assert main(["run", name, "--redis", url, "--", sys.executable, "-c", probe]) == 0
    assert main(["status", name, "--redis", url]) == 1  # free
    out = capsys.readouterr().out
    assert "free" in out
    assert "fence counter: 1" in out  # the run held it once, through valkey-py
    assert main(["status", name, "--redis", "memcached://127.0.0.1:1"]) == 2
    assert "unknown URL scheme" in capsys.readouterr().err


def test_a_subclass_of_a_family_client_takes_the_same_path(
    family: ClientFamily, server: servers.ServerProcess, name: str
) -> None:
    """An application's own subclass of ``redis.Redis`` / ``valkey.Valkey`` is of the family:
    redlease's own connections (so waits leave its pool alone), and ``replicas=``."""
    from redlease._sync.io import IO

    own_type = type("AppClient", (type(family.client(port=1)),), {})
    client = own_type(port=server.port)
    try:
        assert IO(client).pool is not None
        redlease.Lock(client, name, replicas=1)  # accepted: WAIT can follow on our connection
        with redlease.Lock(client, name) as lease:
            assert lease.fence >= 1
    finally:
        client.close()


def _before_7(client: Any) -> bool:
    return int(str(client.info("server")["redis_version"]).split(".")[0]) < 7


def test_an_error_reply_is_not_sent_again(
    family: ClientFamily,
    master_and_replica: tuple[servers.ServerProcess, servers.ServerProcess],
    name: str,
) -> None:
    """A script the server refused (READONLY, on a replica) is not a lost reply: it is not
    sent a second time, whatever the client's retry policy."""
    _, replica = master_and_replica
    client = family.client(port=replica.port)
    try:
        client.config_resetstat()
        with pytest.raises(redlease.BackendError, match="read-only replica"):
            redlease.Lock(client, name).try_acquire()
        # the acquire script's SET, refused as many times as the script was sent
        refused = client.info("commandstats").get("cmdstat_set", {})
        if refused or not _before_7(client):  # (Redis 6.2 counts no refused calls)
            assert refused.get("rejected_calls", 0) + refused.get("failed_calls", 0) == 1
    finally:
        client.close()
