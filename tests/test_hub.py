"""Waiting at scale: the waiters of one process share one wait connection per server
(the hub), a dead waiter is skipped at once, and losing the shared connection costs a
look at the lock, never a hang. Real servers; connection counts from CLIENT LIST."""

from __future__ import annotations

import asyncio
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
from redlease import _hub_sync, servers
from waiting_helpers import queued, wait_until

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


class Waiters:
    """``count`` threads, each waiting for ``lock`` once and holding it for a moment."""

    def __init__(self, lock: redlease.Lock, count: int, timeout: float = 120.0) -> None:
        self.done: list[int] = []
        self.errors: list[BaseException] = []

        def waiter(i: int) -> None:
            try:
                with lock.acquire(timeout=timeout):
                    self.done.append(i)
            except BaseException as exc:
                self.errors.append(exc)

        self.threads = [threading.Thread(target=waiter, args=(i,)) for i in range(count)]
        for t in self.threads:
            t.start()

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=120)
        assert self.errors == []
        assert sorted(self.done) == list(range(len(self.threads)))


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

    tasks = [asyncio.create_task(waiter(i)) for i in range(2000)]

    async def total_queued_is(count: int) -> bool:
        async with ar.pipeline(transaction=False) as pipe:
            for i in range(200):
                pipe.llen("{" + f"{name}:{i}" + "}:queue")
            return bool(sum(await pipe.execute()) == count)

    await until(lambda: total_queued_is(2000))
    await asyncio.sleep(0.2)
    held = [c for c in await ar.client_list() if c.get("name") == label]
    assert len(held) <= HANDFUL, f"{len(held)} connections for 2,000 waiters"
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
    key = "{" + name + "}:queue"

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
