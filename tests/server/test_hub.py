"""Waiting at scale: the waiters of one process share one wait connection per server
(the hub), a dead waiter is skipped at once, and losing the shared connection costs a
look at the lock, never a hang. Real servers; connection counts from CLIENT LIST."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import families
import redlease
from redlease._sync import conn as _hub_sync
from redlease.tools import servers
from waiting_helpers import Waiters, lock_key, queued, script_calls, wait_until

# What a process's waiters may hold, whatever their number: the hub's connection, the
# idle connections redlease keeps for short commands (8), and one spare.
HANDFUL = 10
# A live waiter behind a dead one, or a newcomer, gets the lock this soon after the
# release (the bar is 1 s; the bound leaves room for a slow, shared machine).
SKIP_BOUND = 3.0

_tags = itertools.count()


def tag() -> str:
    """A client name no other test uses: redlease's connections carry it too."""
    return f"hubtest-{os.getpid()}-{next(_tags)}"


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def connections(r: redis.Redis, name: str) -> list[dict[str, Any]]:
    return [c for c in r.client_list() if c.get("name") == name]


def hubs(held: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The connections subscribed to a channel: hubs."""
    return [c for c in held if c.get("sub") not in (None, "0", 0)]


def test_300_threads_wait_on_a_handful_of_connections(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    label = tag()
    client = families.client(port=server.port, client_name=label)
    lock = redlease.Lock(client, name, ttl=30.0)
    holder = lock.acquire()
    waiters = Waiters(lock, 300)
    wait_until(lambda: queued(r, name) == 300, timeout=60)
    time.sleep(0.2)
    held = connections(r, label)
    assert len(held) <= HANDFUL, f"{len(held)} connections for 300 waiters"
    assert len(hubs(held)) == 1
    holder.release()
    waiters.join()
    assert queued(r, name) == 0


async def test_2000_tasks_on_200_names_wait_on_a_handful_of_connections(
    server: servers.ServerProcess, ar: aredis.Redis, name: str
) -> None:
    label = tag()
    client = families.aclient(port=server.port, client_name=label)
    locks = [redlease.AsyncLock(client, f"{name}:{i}", ttl=30.0) for i in range(200)]
    holders = [await lock.acquire() for lock in locks]
    done: list[int] = []

    async def waiter(i: int) -> None:
        async with await locks[i % 200].acquire(timeout=120):
            done.append(i)

    async def counts() -> tuple[int, int]:
        stats = await ar.info("commandstats")
        return int(stats.get("cmdstat_subscribe", {}).get("calls", 0)), script_calls(stats)

    subscribed, scripts = await counts()
    tasks = [asyncio.create_task(waiter(i)) for i in range(2000)]

    async def total_queued_is(count: int) -> bool:
        async with ar.pipeline(transaction=False) as pipe:
            for i in range(200):
                pipe.llen(lock_key(f"{name}:{i}") + ":line")
            return bool(sum(await pipe.execute()) == count)

    await until(lambda: total_queued_is(2000))
    # (scripts counted as soon as all are queued: the waiters' tries, not what a long
    # wait may add later, such as a retry once the holders' ttl has run out)
    _, now_scripts = await counts()

    async def held() -> list[dict[str, Any]]:
        return [c for c in await ar.client_list() if c.get("name") == label]

    async def settled() -> bool:
        return len(await held()) <= HANDFUL

    # (the last replies may still be on their way back to their tasks on a busy machine:
    # the connections they came on go once given back, with nobody left to take them)
    with contextlib.suppress(AssertionError):
        await until(settled, 30.0)
    now_held = await held()
    assert len(now_held) <= HANDFUL, f"{len(now_held)} connections for 2,000 waiters"
    # One SUBSCRIBE a name, however many wait for it at once (it was one a waiter); and a
    # waiter of a lock another waiter of this process waits for queues at once: a try
    # first, which would only fail, is made by the first waiter of each name alone.
    now_subscribed, _ = await counts()
    assert now_subscribed - subscribed == 200
    assert now_scripts - scripts <= 2000 + 200 + 50  # (two each: 4,000)
    for holder in holders:
        await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 120)
    assert sorted(done) == list(range(2000))
    await client.aclose()


def _queue_then_die(
    server: servers.ServerProcess, name: str, fair: bool
) -> subprocess.Popen[bytes]:
    code = textwrap.dedent(f"""
        import redis, redlease
        client = redis.Redis.from_url({server.url!r})
        redlease.Lock(client, {name!r}, ttl=10.0, fair={fair!r}).acquire(timeout=60)
    """)
    return subprocess.Popen([sys.executable, "-c", code])


@pytest.mark.parametrize("fair", [True, False])
@pytest.mark.parametrize("who", ["queued behind", "newcomer"])
def test_a_queued_waiter_killed_does_not_hold_up_the_line(
    server: servers.ServerProcess, r: redis.Redis, name: str, fair: bool, who: str
) -> None:
    lock = redlease.Lock(r, name, ttl=10.0, fair=fair)
    holder = lock.acquire()
    doomed = _queue_then_die(server, name, fair)
    try:
        wait_until(lambda: queued(r, name) == 1, timeout=30)
    finally:
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=30)
    got: list[float] = []

    def live() -> None:
        with lock.acquire(timeout=30):
            got.append(time.monotonic())

    thread = threading.Thread(target=live)
    if who == "queued behind":
        thread.start()
        wait_until(lambda: queued(r, name) == 2)
    time.sleep(0.1)  # the server has noticed the dead process's connections closing
    released = time.monotonic()
    holder.release()
    if who == "newcomer":
        thread.start()
    thread.join(timeout=60)
    assert got, "the live waiter never got the lock"
    assert got[0] - released < SKIP_BOUND


def test_the_shared_wait_connection_killed_while_100_wait(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    label = tag()
    client = families.client(port=server.port, client_name=label)
    lock = redlease.Lock(client, name, ttl=30.0)
    holder = lock.acquire()
    waiters = Waiters(lock, 100, timeout=60)
    wait_until(lambda: queued(r, name) == 100, timeout=60)
    hub = hubs(connections(r, label))
    assert len(hub) == 1
    r.client_kill_filter(_id=hub[0]["id"])
    holder.release()  # rings a hub that is gone: every waiter looks at the lock again
    started = time.monotonic()
    waiters.join()
    assert time.monotonic() - started < 30  # nobody waited for a timeout
    assert queued(r, name) == 0


async def test_cancelling_one_of_100_waiters_disturbs_no_other(
    server: servers.ServerProcess, ar: aredis.Redis, name: str
) -> None:
    label = tag()
    client = families.aclient(port=server.port, client_name=label)
    lock = redlease.AsyncLock(client, name, ttl=30.0)
    holder = await lock.acquire()
    done: list[int] = []

    async def waiter(i: int) -> None:
        async with await lock.acquire(timeout=60):
            done.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(100)]
    key = lock_key(name) + ":line"

    async def queue_is(length: int) -> bool:
        return int(await ar.llen(key)) == length

    await until(lambda: queue_is(100))
    held = [c for c in await ar.client_list() if c.get("name") == label]
    assert len(held) <= HANDFUL  # they wait through the hub
    tasks[50].cancel()
    await until(lambda: queue_is(99))
    await holder.release()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    assert isinstance(results[50], asyncio.CancelledError)
    assert sorted(done) == [i for i in range(100) if i != 50]
    assert await ar.llen(key) == 0
    await client.aclose()


def test_a_user_without_channel_rights_waits_on_bells(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    user = tag()
    r.acl_setuser(
        user,
        enabled=True,
        passwords=["+secret"],
        keys=["*"],
        commands=["+@all"],
        reset_channels=True,
    )
    try:
        client = families.client(port=server.port, username=user, password="secret")
        with pytest.raises(families.errors().ResponseError, match=r"(?i)permission"):
            client.publish("any", "x")  # the user may not use pub/sub at all
        lock = redlease.Lock(client, name, ttl=30.0)
        holder = lock.acquire()
        done: list[int] = []

        def waiter(i: int) -> None:
            with lock.acquire(timeout=60):
                done.append(i)

        threads = [threading.Thread(target=waiter, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        wait_until(lambda: queued(r, name) == 3, timeout=30)
        holder.release()
        for t in threads:
            t.join(timeout=60)
        assert sorted(done) == [0, 1, 2]
    finally:
        r.acl_deluser(user)


def test_a_channel_is_unsubscribed_only_once_unused_for_the_linger() -> None:
    class Box:
        channel = "{a}:bell:@1"

    used = {"{a}:bell:@1": 0.0, "{b}:bell:@1": 0.0, "{c}:bell:@1": 100.0}
    subscribed = set(used)
    idle = _hub_sync.forget_idle(used, {"t": Box()}, subscribed, now=_hub_sync.LINGER + 50.0)
    assert idle == ["{b}:bell:@1"]  # {a}: a waiter still uses it; {c}: used lately
    assert "{b}:bell:@1" not in used
    assert subscribed == {"{a}:bell:@1", "{c}:bell:@1"}


# -- Redis Cluster: a hub per node, sharded pub/sub ------------------------------------


def _node_clients(cluster: list[servers.ServerProcess]) -> list[Any]:
    # (Any: redis-py leaves execute_command untyped)
    return [families.client(port=node.port) for node in cluster]


def _spread(client: Any, prefix: str, count: int) -> list[str]:
    """``count`` lock names whose slots cover every node of the cluster."""
    names = [f"{prefix}:{i}" for i in range(count)]
    owners = {client.get_node_from_key(lock_key(n)).name for n in names}
    assert len(owners) == 3, owners
    return names


def _held_per_node(nodes: list[Any], label: str) -> list[list[dict[str, Any]]]:
    return [connections(node, label) for node in nodes]


def _blocked(held: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Connections blocked in a command (a waiter's own BLPOP)."""
    return [c for c in held if "b" in str(c.get("flags", ""))]


def _sharded_hubs(held: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # (CLIENT LIST names sharded subscriptions "ssub" from Redis 7.0.3 on)
    return [c for c in held if c.get("ssub") not in (None, "0", 0) or c.get("cmd") == "ssubscribe"]


def test_threads_waiting_on_100_names_across_a_cluster(
    cluster: list[servers.ServerProcess], family: families.ClientFamily
) -> None:
    """200 threads wait on 100 names spread over 3 masters: each node sees one hub of the
    process and a handful of connections, no waiter blocks a connection of its own, and
    every waiter is served once the holders release."""
    label = tag()
    client = family.cluster(cluster[0].port)  # the holders'
    waiting = family.cluster(cluster[0].port, client_name=label)
    nodes = _node_clients(cluster)
    try:
        names = _spread(client, "tw", 100)
        holders = [redlease.Lock(client, n, ttl=60.0).acquire() for n in names]
        done: list[str] = []
        errors: list[BaseException] = []

        def waiter(n: str) -> None:
            try:
                with redlease.Lock(waiting, n, ttl=60.0).acquire(timeout=120):
                    done.append(n)
            except BaseException as exc:
                errors.append(exc)

        threads = []
        for i, n in enumerate(names * 2):  # one at a time: the client's pool stays small
            threads.append(threading.Thread(target=waiter, args=(n,)))
            threads[-1].start()
            wait_until(lambda i=i: sum(client.llen(lock_key(m) + ":line") for m in names) > i)
        time.sleep(0.2)
        for held in _held_per_node(nodes, label):
            assert len(held) <= HANDFUL, f"{len(held)} connections to a node for 200 waiters"
            assert _blocked(held) == []
            assert len(_sharded_hubs(held)) == 1
        for holder in holders:
            holder.release()
        for t in threads:
            t.join(timeout=120)
        assert errors == []
        assert sorted(done) == sorted(names * 2)
        assert sum(client.llen(lock_key(n) + ":line") for n in names) == 0
    finally:
        for c in (client, waiting, *nodes):
            c.close()


async def test_tasks_waiting_on_100_names_across_a_cluster(
    cluster: list[servers.ServerProcess], family: families.ClientFamily
) -> None:
    """1,000 asyncio tasks on 100 names over 3 masters: one hub per node, no task blocks
    a connection, all served in turn."""
    label = tag()
    client = family.acluster(cluster[0].port)
    waiting = family.acluster(cluster[0].port, client_name=label)
    nodes = _node_clients(cluster)
    try:
        await client.initialize()
        names = _spread(client, "aw", 100)
        holders = [await redlease.AsyncLock(client, n, ttl=60.0).acquire() for n in names]
        done: list[int] = []

        async def waiter(i: int) -> None:
            lock = redlease.AsyncLock(waiting, names[i % 100], ttl=60.0)
            async with await lock.acquire(timeout=120):
                done.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(1000)]

        async def all_queued() -> bool:
            counts = [await client.llen(lock_key(n) + ":line") for n in names]
            return bool(sum(counts) == 1000)

        await until(all_queued)
        await asyncio.sleep(0.2)
        for held in _held_per_node(nodes, label):
            assert _blocked(held) == []
            assert len(_sharded_hubs(held)) == 1
        for holder in holders:
            await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        assert sorted(done) == list(range(1000))
    finally:
        await client.aclose()
        await waiting.aclose()
        for c in nodes:
            c.close()


def _move_slot(nodes: list[Any], slot: int, source: int, target: int) -> None:
    """Reshard ``slot`` (and its keys) from node ``source`` to node ``target``."""
    src, dst = nodes[source], nodes[target]
    src_id = src.execute_command("CLUSTER", "MYID")
    dst_id = dst.execute_command("CLUSTER", "MYID")
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    port = dst.connection_pool.connection_kwargs["port"]
    while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        src.execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys)
    for node in nodes:
        node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


def test_waiters_follow_their_lock_when_its_slot_moves(
    cluster: list[servers.ServerProcess], family: families.ClientFamily
) -> None:
    """The lock's slot is resharded to another node while 5 threads wait on it: the old
    node unsubscribes their hub, they look again and listen on the new node, and the
    release there serves them all in turn, long before their ttl-long waits end."""
    label = tag()
    client = family.cluster(cluster[0].port)
    waiting = family.cluster(cluster[0].port, client_name=label)
    nodes = _node_clients(cluster)
    try:
        name = "moving"
        holder = redlease.Lock(client, name, ttl=30.0).acquire()
        waiters = Waiters(redlease.Lock(waiting, name, ttl=30.0), 5)
        wait_until(lambda: client.llen(lock_key("moving") + ":line") == 5, timeout=60)
        owner = client.get_node_from_key("{moving}").port
        source = [node.port for node in cluster].index(owner)
        _move_slot(nodes, client.keyslot("{moving}"), source, (source + 1) % 3)
        released = time.monotonic()
        holder.release()
        waiters.join()
        # (each waiter's own round lasts the ttl, 30 s, and nothing else would wake it)
        assert time.monotonic() - released < 15.0
        # They followed the lock to the new node: through the process's hub there, as a
        # rule; a waiter whose look met the topology still moving may wait on a bell of
        # its own there instead (seen once in CI, on a loaded machine), served as well.
        assert connections(nodes[(source + 1) % 3], label)
    finally:
        for c in (client, waiting, *nodes):
            c.close()


def test_a_hub_redirected_by_its_node_starts_over_instead_of_giving_up(
    cluster: list[servers.ServerProcess], family: families.ClientFamily
) -> None:
    """A node answers the hub's SSUBSCRIBE with MOVED (its topology was stale): the hub
    drops its connection (the waiter looks again) and does not take that for a refusal,
    which would send every later waiter of that node to bells."""
    from redlease._clients import ConnectionFailed
    from redlease._sync import conn as _conn_sync

    client = family.cluster(cluster[0].port)
    try:
        owner = client.get_node_from_key("{strayed}")
        other = next(n for n in client.get_primaries() if n.name != owner.name)
        stray, home = _conn_sync.node_pool(client, other), _conn_sync.node_pool(client, owner)
        assert stray is not None
        assert home is not None
        hub, right = stray.hub, home.hub
        assert hub is not None
        assert right is not None
        assert hub.id.startswith("s")
        box = hub.listen("{strayed}:bell:", "token-1")
        assert box is not None
        with pytest.raises(ConnectionFailed):
            hub.subscribe(box, 5.0)
        assert not hub.refused
        mine = right.listen("{strayed}:bell:", "token-2")
        assert mine is not None
        assert right.subscribe(mine, 5.0) is mine
        assert mine.ready
    finally:
        client.close()


def test_a_hub_left_on_a_demoted_server_never_hears_of_a_grant(server_kind: str) -> None:
    """The server a waiter's hub listens on is demoted to a replica of the new master
    (a failover its process's client does not follow). A release on the new master finds
    nobody listening there and serves the next one; it must not publish all the same:
    replication would carry the ring to the old server, and the waiter would take a grant
    that was undone for a lock someone else holds."""
    binary = servers.find_binary(server_kind)
    old, new = servers.ServerProcess(binary).start(), servers.ServerProcess(binary).start()
    # (Any: redis-py leaves execute_command untyped)
    to_old: Any = families.client(port=old.port)
    to_new: Any = families.client(port=new.port)
    try:
        to_new.execute_command("REPLICAOF", "127.0.0.1", old.port)
        wait_until(lambda: to_new.info("replication")["master_link_status"] == "up", 30)
        name = "demoted"
        redlease.Lock(to_old, name, ttl=30.0).acquire()  # held on, never released
        got: list[redlease.Lease] = []
        failed: list[BaseException] = []

        def waiter() -> None:
            try:
                got.append(redlease.Lock(to_old, name, ttl=30.0).acquire(timeout=8))
            except redlease.LockError as exc:
                failed.append(exc)

        thread = threading.Thread(target=waiter)
        thread.start()
        wait_until(lambda: queued(to_old, name) == 1 and queued(to_new, name) == 1, 30)
        to_new.execute_command("REPLICAOF", "NO", "ONE")
        to_old.execute_command("REPLICAOF", "127.0.0.1", new.port)
        wait_until(lambda: to_old.info("replication")["master_link_status"] == "up", 30)
        to_new.delete(lock_key(name))  # the holder's lease ends on the new master
        newcomer = redlease.Lock(to_new, name, ttl=30.0).acquire(timeout=10)
        thread.join(30)
        assert got == [], "the waiter took a grant that was undone"
        assert failed  # (its tries reach a replica now: it gives up at its deadline)
        assert to_new.get(lock_key(name)) == newcomer.token.encode()
    finally:
        for c in (to_old, to_new):
            c.close()
        old.stop()
        new.stop()


async def test_a_lock_taken_again_and_again_uncontended_never_subscribes(
    server: servers.ServerProcess, family: families.ClientFamily, ar: aredis.Redis, name: str
) -> None:
    """Only a lock another attempt of this process is at skips the try: one taken in
    turn, nobody waiting, costs no SUBSCRIBE (nor does its blocking twin's)."""
    stats = await ar.info("commandstats")
    before = int(stats.get("cmdstat_subscribe", {}).get("calls", 0))
    lock = redlease.AsyncLock(ar, name, ttl=10.0)
    for _ in range(20):
        await (await lock.acquire(timeout=5)).release()
    client = family.client(port=server.port)
    blocking = redlease.Lock(client, name, ttl=10.0)
    for _ in range(20):
        blocking.acquire(timeout=5).release()
    client.close()
    stats = await ar.info("commandstats")
    assert int(stats.get("cmdstat_subscribe", {}).get("calls", 0)) == before
