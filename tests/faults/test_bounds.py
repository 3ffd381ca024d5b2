"""Every wait honours its bound (issue 15), against real server processes: grants that
arrive too late, a ttl too short to give any validity, ``replicas=`` with a short
deadline and with auto-renewal, and Redlock rounds that miss a quorum because nodes are
down. Bounds are generous: the machine is small and shared."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import pytest
import redis

import families
import redlease
from redlease.tools import servers
from redlease.tools.chaos.proxy import FaultProxy
from waiting_helpers import lock_key, script_calls

# How long a call that used to hang is given before the test calls it hung.
HUNG = 8.0


def _script_calls(client: Any) -> int:
    """Scripts the server has run (the suite's tests run one at a time on it)."""
    return script_calls(client.info("commandstats"))


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``call`` in a daemon thread; the dict gets its result or error and duration."""
    out: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            out["result"] = call()
        except BaseException as exc:
            out["error"] = exc
        out["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


# -- 1. grants that arrive too late, and a ttl too short to be valid ----------------------


@pytest.fixture
def slow_link(server: servers.ServerProcess) -> Iterator[FaultProxy]:
    """A link whose round trip (240 ms) is longer than a 0.2 s lease's validity."""
    families.client(port=server.port).flushall()
    with FaultProxy("127.0.0.1", server.port).start() as proxy:
        proxy.set_mode("delay", delay_ms=120)
        yield proxy


@pytest.mark.parametrize("call", ["try_acquire", "acquire"])
def test_grants_that_always_arrive_too_late_do_not_loop_forever(
    server: servers.ServerProcess, slow_link: FaultProxy, name: str, call: str
) -> None:
    client = families.client(port=slow_link.port)
    direct = families.client(port=server.port)
    scripts_before = _script_calls(direct)
    lock = redlease.Lock(client, name, ttl=0.2)
    if call == "try_acquire":
        thread, out = _in_thread(lock.try_acquire)
    else:
        thread, out = _in_thread(lambda: lock.acquire(timeout=0.5))
    try:
        thread.join(HUNG)
        assert not thread.is_alive(), f"{call} never returned: every grant came too late"
        if call == "try_acquire":
            assert out.get("result", "missing") is None, out
        else:
            assert isinstance(out.get("error"), redlease.AcquireTimeout), out
        # one attempt is two round trips (acquire, give back) plus connecting
        assert out["took"] < (2.5 if call == "try_acquire" else 3.5)
        assert direct.exists(lock_key(name)) == 0  # every late grant was given back
        # each attempt is an acquire and a give-back: a few, not thousands
        assert 0 < _script_calls(direct) - scripts_before < 40
    finally:
        direct.close()
        slow_link.set_mode("reset")  # a hung caller gets errors and ends
        thread.join(HUNG)
        client.close()


async def test_async_grants_that_always_arrive_too_late_do_not_loop_forever(
    slow_link: FaultProxy, name: str
) -> None:
    client = families.aclient(port=slow_link.port)
    lock = redlease.AsyncLock(client, name, ttl=0.2)
    try:
        started = time.monotonic()
        assert await asyncio.wait_for(lock.try_acquire(), HUNG) is None
        assert time.monotonic() - started < 2.5
        started = time.monotonic()
        with pytest.raises(redlease.AcquireTimeout):
            await asyncio.wait_for(lock.acquire(timeout=0.5), HUNG)
        assert time.monotonic() - started < 3.5
    finally:
        slow_link.set_mode("pass")
        await client.aclose()


@pytest.mark.parametrize("ttl", [0.001, 0.002, timedelta(milliseconds=2), 0.0015])
def test_a_ttl_that_leaves_no_validity_is_refused(ttl: Any) -> None:
    """validity = ttl - (ttl * 1% + 2 ms) must be positive: 3 ms is the shortest ttl."""
    sync_client, async_client = families.client(port=1), families.aclient(port=1)  # never used
    makers: list[Callable[[], object]] = [
        lambda: redlease.Lock(sync_client, "x", ttl=ttl),
        lambda: redlease.AsyncLock(async_client, "x", ttl=ttl),
        lambda: redlease.Redlock([sync_client], "x", ttl=ttl),
        lambda: redlease.AsyncRedlock([async_client], "x", ttl=ttl),
    ]
    for make in makers:
        with pytest.raises(redlease.InvalidArgument, match="ttl"):
            make()
    redlease.Lock(sync_client, "x", ttl=0.003)
    redlease.Redlock([sync_client], "x", ttl=0.003)


def test_extend_refuses_a_ttl_that_leaves_no_validity(r: redis.Redis, name: str) -> None:
    lease = redlease.Lock(r, name, ttl=5.0).acquire()
    with pytest.raises(redlease.InvalidArgument, match="ttl"):
        lease.extend(0.002)
    lease.release()


def test_the_shortest_ttl_still_gives_a_usable_lease(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=0.003)
    started = time.monotonic()
    for _ in range(20):  # a grant may come too late on a busy machine; a timeout is fine
        with contextlib.suppress(redlease.AcquireTimeout):
            lock.acquire(timeout=0.05)
    assert time.monotonic() - started < 5.0


# -- 2. replicas= ---------------------------------------------------------------------------


def test_wait_for_replicas_is_bounded_by_the_acquire_deadline(
    master_and_replica: tuple[servers.ServerProcess, servers.ServerProcess], name: str
) -> None:
    master, replica = master_and_replica
    client = families.client(port=master.port)
    # A WAIT of its own would last ttl / 10 = 3 s.
    lock = redlease.Lock(client, name, ttl=30.0, replicas=1)
    replica.pause()  # it acknowledges nothing
    try:
        started = time.monotonic()
        with pytest.raises(redlease.BackendError, match="only 0 of 1 replicas"):
            lock.acquire(timeout=0.003)  # free: granted, but not replicated in time
        assert time.monotonic() - started < 1.0
        assert client.exists(lock_key(name)) == 0  # given back
        holder = redlease.Lock(client, name, ttl=30.0).acquire()
        started = time.monotonic()
        with pytest.raises(redlease.AcquireTimeout):
            lock.acquire(timeout=0.003)  # busy: queued, waits, leaves
        assert time.monotonic() - started < 1.0
        holder.release()
    finally:
        replica.resume()
        client.close()


async def test_async_wait_for_replicas_is_bounded_by_the_acquire_deadline(
    master_and_replica: tuple[servers.ServerProcess, servers.ServerProcess], name: str
) -> None:
    master, replica = master_and_replica
    client = families.aclient(port=master.port)
    lock = redlease.AsyncLock(client, name, ttl=30.0, replicas=1)
    replica.pause()
    try:
        started = time.monotonic()
        with pytest.raises(redlease.BackendError, match="only 0 of 1 replicas"):
            await lock.acquire(timeout=0.003)
        assert time.monotonic() - started < 1.0
    finally:
        replica.resume()
        await client.aclose()


def test_auto_renew_with_replicas_keeps_the_lease(
    master_and_replica: tuple[servers.ServerProcess, servers.ServerProcess], name: str
) -> None:
    master, replica = master_and_replica
    client = families.client(port=master.port)
    lost: list[object] = []
    lock = redlease.Lock(client, name, ttl=0.6, replicas=1, auto_renew=True, on_lost=lost.append)
    try:
        with lock as lease:
            time.sleep(1.8)  # three ttls
            assert not lease.lost
            assert not lost
            assert lease.remaining() > 0.1
            on_replica = families.client(port=replica.port)
            assert on_replica.get(lock_key(name)) == lease.token.encode()
            on_replica.close()
        assert client.exists(lock_key(name)) == 0
    finally:
        client.close()


async def test_async_auto_renew_with_replicas_keeps_the_lease(
    master_and_replica: tuple[servers.ServerProcess, servers.ServerProcess], name: str
) -> None:
    master, _ = master_and_replica
    client = families.aclient(port=master.port)
    lost: list[object] = []
    lock = redlease.AsyncLock(
        client, name, ttl=0.6, replicas=1, auto_renew=True, on_lost=lost.append
    )
    try:
        async with lock as lease:
            await asyncio.sleep(1.8)
            assert not lease.lost
            assert not lost
            assert lease.remaining() > 0.1
        assert await client.exists(lock_key(name)) == 0
    finally:
        await client.aclose()


def test_a_renewal_the_replicas_do_not_acknowledge_does_not_count(
    master_and_replica: tuple[servers.ServerProcess, servers.ServerProcess], name: str
) -> None:
    master, replica = master_and_replica
    client = families.client(port=master.port)
    lost: list[object] = []
    lock = redlease.Lock(client, name, ttl=0.6, replicas=1, auto_renew=True, on_lost=lost.append)
    try:
        lease = lock.acquire()
        replica.pause()
        time.sleep(1.0)  # renewals reach the master only: the lease runs out
        assert lease.lost
        assert lost == [lease]
    finally:
        replica.resume()
        client.close()


# -- 3. Redlock retries a round without a quorum until its timeout -------------------------


@pytest.fixture
def three(server_kind: str) -> Iterator[list[servers.ServerProcess]]:
    """Three nodes of this test's own: some are killed and restarted on their ports."""
    with servers.running(3, server_kind) as started:
        yield started


def _down(nodes: list[servers.ServerProcess], how: str) -> None:
    for node in nodes:
        if how == "pause":
            node.pause()
        else:
            node.kill()


def _up(nodes: list[servers.ServerProcess], how: str) -> None:
    for node in nodes:
        if how == "pause":
            node.resume()
        else:
            node.restart()


class _Wrapped:
    """A client type redlease does not know (a wrapper): only its public command methods
    are used, with their own timeouts."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_redlock_gives_up_on_a_hung_node_it_reaches_through_the_client(
    three: list[servers.ServerProcess], name: str
) -> None:
    """A node reached through the client's own methods (no connection of redlease's) is
    still given up on after node_timeout, not after the client's socket_timeout."""
    with ExitStack() as stack:
        clients = [
            _Wrapped(stack.enter_context(families.client(port=p.port, socket_timeout=HUNG)))
            for p in three
        ]
        lock = redlease.Redlock(clients, name, ttl=5.0, node_timeout=0.2)
        lock.acquire().release()  # connections are open before the outage
        three[0].pause()
        try:
            thread, out = _in_thread(lock.try_acquire)
            thread.join(HUNG)
        finally:
            three[0].resume()
        lease = out.get("result")
        assert isinstance(lease, redlease.RedlockLease), out  # 2 of 3 said yes
        assert out["took"] < HUNG / 2
        lease.release()
        three[0].pause()
        try:  # more rounds while it hangs: its call given up on is not started again
            for _ in range(4):
                lock.try_acquire()
            stuck = [t for t in threading.enumerate() if t.name == "redlease-bounded-call"]
            assert len(stuck) <= 1
        finally:
            three[0].resume()


async def test_async_redlock_gives_up_on_a_hung_node_it_reaches_through_the_client(
    three: list[servers.ServerProcess], name: str
) -> None:
    clients = [_Wrapped(families.aclient(port=p.port, socket_timeout=HUNG)) for p in three]
    try:
        lock = redlease.AsyncRedlock(clients, name, ttl=5.0, node_timeout=0.2)
        await (await lock.acquire()).release()
        three[0].pause()
        try:
            started = time.monotonic()
            lease = await lock.try_acquire()
            took = time.monotonic() - started
        finally:
            three[0].resume()
        assert isinstance(lease, redlease.AsyncRedlockLease)
        assert took < HUNG / 2
        await lease.release()
    finally:
        for client in clients:
            await client.aclose()


@pytest.mark.parametrize("how", ["kill", "pause"])
def test_redlock_waits_for_nodes_that_come_back(
    three: list[servers.ServerProcess], name: str, how: str
) -> None:
    with ExitStack() as stack:
        clients = [stack.enter_context(families.client(port=p.port)) for p in three]
        lock = redlease.Redlock(clients, name, ttl=5.0)
        lock.acquire().release()  # connections are open before the outage
        _down(three[1:], how)
        try:
            thread, out = _in_thread(lambda: lock.acquire(timeout=5.0))
            time.sleep(1.0)
            assert thread.is_alive(), out  # still retrying, not given up
        finally:
            _up(three[1:], how)
        thread.join(HUNG)
        assert not thread.is_alive()
        lease = out.get("result")
        assert isinstance(lease, redlease.RedlockLease), out
        assert 0.8 <= out["took"] < 5.0
        lease.release()


@pytest.mark.parametrize("how", ["kill", "pause"])
async def test_async_redlock_waits_for_nodes_that_come_back(
    three: list[servers.ServerProcess], name: str, how: str
) -> None:
    clients = [families.aclient(port=p.port) for p in three]
    try:
        lock = redlease.AsyncRedlock(clients, name, ttl=5.0)
        await (await lock.acquire()).release()
        _down(three[1:], how)
        try:
            started = time.monotonic()
            task = asyncio.ensure_future(lock.acquire(timeout=5.0))
            await asyncio.sleep(1.0)
            assert not task.done()
        finally:
            await asyncio.to_thread(_up, three[1:], how)
        lease = await asyncio.wait_for(task, HUNG)
        assert 0.8 <= time.monotonic() - started < 5.0
        await lease.release()
    finally:
        for c in clients:
            await c.aclose()


@pytest.mark.parametrize("how", ["kill", "pause"])
def test_redlock_with_nodes_down_for_good_fails_at_its_timeout(
    three: list[servers.ServerProcess], name: str, how: str
) -> None:
    with ExitStack() as stack:
        clients = [stack.enter_context(families.client(port=p.port)) for p in three]
        lock = redlease.Redlock(clients, name, ttl=5.0)
        _down(three[1:], how)
        try:
            started = time.monotonic()
            with pytest.raises(redlease.QuorumError) as raised:
                lock.acquire(timeout=1.0)
            assert 0.8 <= time.monotonic() - started < 4.0
            assert sorted(raised.value.failures) == sorted(
                f"localhost:{p.port}/0" for p in three[1:]
            )
            assert clients[0].exists(lock_key(name)) == 0  # nothing left behind
            started = time.monotonic()
            with pytest.raises(redlease.QuorumError):
                lock.try_acquire()  # one round
            assert time.monotonic() - started < 0.8
        finally:
            _up(three[1:], how)


async def test_async_redlock_with_nodes_down_for_good_fails_at_its_timeout(
    three: list[servers.ServerProcess], name: str
) -> None:
    clients = [families.aclient(port=p.port) for p in three]
    try:
        lock = redlease.AsyncRedlock(clients, name, ttl=5.0)
        _down(three[1:], "kill")
        started = time.monotonic()
        with pytest.raises(redlease.QuorumError) as raised:
            await lock.acquire(timeout=1.0)
        assert 0.8 <= time.monotonic() - started < 4.0
        assert len(raised.value.failures) == 2
    finally:
        for c in clients:
            await c.aclose()


def test_redlock_contention_still_ends_in_acquire_timeout(
    three: list[servers.ServerProcess], name: str
) -> None:
    with ExitStack() as stack:
        clients = [stack.enter_context(families.client(port=p.port)) for p in three]
        lock = redlease.Redlock(clients, name, ttl=5.0)
        holder = lock.acquire()
        started = time.monotonic()
        with pytest.raises(redlease.AcquireTimeout):
            lock.acquire(timeout=0.5)
        assert 0.4 <= time.monotonic() - started < 3.0
        holder.release()
