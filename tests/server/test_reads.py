"""How the drivers read replies on redlease's own sockets: a short poll before sleeping
(which a slow link or a busy machine turns off by itself, and REDLEASE_SPIN_US sets),
RESP2 whatever the client speaks, replies in order."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import families
import redlease
from redlease._async import backend as _backend_async
from redlease._wire import resp as _resp
from redlease.tools import servers
from redlease.tools.chaos.proxy import FaultProxy
from waiting_helpers import lock_key


def spin_record(client: redis.Redis | aredis.Redis) -> Any:
    from redlease._async.io import AsyncIO
    from redlease._clients.checks import is_async_client
    from redlease._sync.io import IO

    io = AsyncIO(client) if is_async_client(client) else IO(client)
    assert io.pool is not None
    return io.pool.spin


def test_a_slow_link_stops_the_spinning(server: servers.ServerProcess, name: str) -> None:
    with FaultProxy("127.0.0.1", server.port).start() as proxy:
        proxy.set_mode("delay", delay_ms=5)  # every reply far later than a spin lasts
        client = families.client(port=proxy.port)
        lock = redlease.Lock(client, name, ttl=5.0)
        fences = []
        for _ in range(_resp.MISSES):  # two reads each: acquire, release
            with lock as lease:
                fences.append(lease.fence)
        record = spin_record(client)
        assert record.rest > _resp.REST - 2 * _resp.MISSES
        resting = record.rest
        with lock:
            pass
        assert record.rest == resting - 2  # these reads slept at once
        assert fences == sorted(set(fences))
        client.close()


def test_spinning_off_gives_the_same_results(
    server: servers.ServerProcess, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = families.client(port=server.port)
    lock = redlease.Lock(client, name, ttl=5.0)
    seen = []
    for budget in (0.0, _resp.BUDGET, 0.0):
        monkeypatch.setattr(_resp, "BUDGET", budget)
        for _ in range(20):
            with lock as lease:
                seen.append(lease.fence)
            first = lock.try_acquire()
            assert first is not None
            assert lock.try_acquire() is None  # the first try holds it
            first.release()
    assert seen == sorted(set(seen))
    client.close()


def test_spin_setting() -> None:
    assert _resp.budget_from(None) == _resp.DEFAULT_BUDGET
    assert _resp.budget_from("0") == 0.0
    assert _resp.budget_from("250") == pytest.approx(250e-6)
    for bad in ("-1", "fast", "1.5"):
        with pytest.warns(redlease.RedleaseWarning, match="REDLEASE_SPIN_US"):
            assert _resp.budget_from(bad) == _resp.DEFAULT_BUDGET
    shown = subprocess.run(
        [sys.executable, "-c", "from redlease._wire import resp; print(resp.BUDGET)"],
        env={**os.environ, "REDLEASE_SPIN_US": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == "0.0"


async def test_a_resp3_client_is_served_on_resp2_sockets(
    server: servers.ServerProcess, name: str
) -> None:
    """redlease's own sockets speak RESP2 whatever the client asked for: no push
    message can come between a command and its reply."""
    client = families.aclient(port=server.port, protocol=3, client_name="app")
    other = families.client(port=server.port)
    try:
        lock = redlease.AsyncLock(client, name, ttl=5.0)
        async with lock as first:
            pass
        async with lock as second:
            assert second.fence > first.fence
        ours = [c for c in other.client_list() if c.get("name") == "app"]
        assert ours
        assert all(c.get("resp", "2") == "2" for c in ours)
        assert other.exists(lock_key(name)) == 0
    finally:
        await client.aclose()
        other.close()


async def test_a_short_read_after_a_long_one_keeps_its_own_deadline(
    server: servers.ServerProcess,
) -> None:
    """The asyncio reads of a connection share one timer, armed for the first read's
    deadline; a later read with a shorter one must still time out on its own."""
    from redlease._async.io import AsyncIO
    from redlease._rules.ops import Command

    client = families.aclient(port=server.port)
    io = AsyncIO(client)
    try:
        assert await io.execute(Command(("PING",), 60.0)) in (True, b"PONG")
        server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(redis.TimeoutError):
                await io.execute(Command(("PING",), 0.2))
            assert time.monotonic() - started < 10  # not the first read's 60 s
        finally:
            server.resume()
        assert await io.execute(Command(("PING",), 5.0)) in (True, b"PONG")
    finally:
        await client.aclose()


async def test_asyncio_reads_poll_too_and_a_slow_link_stops_them(
    server: servers.ServerProcess, name: str
) -> None:
    with FaultProxy("127.0.0.1", server.port).start() as proxy:
        proxy.set_mode("delay", delay_ms=5)
        client = families.aclient(port=proxy.port)
        try:
            lock = redlease.AsyncLock(client, name, ttl=5.0)
            fences = []
            for _ in range(_resp.MISSES):
                async with lock as lease:
                    fences.append(lease.fence)
            record = spin_record(client)
            assert record.rest > _resp.REST - 2 * _resp.MISSES
            resting = record.rest
            async with lock:
                pass
            assert record.rest == resting - 2
            assert fences == sorted(set(fences))
        finally:
            await client.aclose()


async def test_asyncio_spinning_off_gives_the_same_results(
    server: servers.ServerProcess, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = families.aclient(port=server.port)
    try:
        lock = redlease.AsyncLock(client, name, ttl=5.0)
        seen = []
        for budget in (0.0, _resp.BUDGET, 0.0):
            monkeypatch.setattr(_resp, "BUDGET", budget)
            for _ in range(20):
                async with lock as lease:
                    seen.append(lease.fence)
                first = await lock.try_acquire()
                assert first is not None
                assert await lock.try_acquire() is None
                await first.release()
        assert seen == sorted(set(seen))
    finally:
        await client.aclose()


async def test_replies_polled_in_a_row_still_let_the_loop_turn(
    server: servers.ServerProcess, name: str
) -> None:
    """A read answered by polling never suspends; a run of them must still let timers
    and I/O of other tasks through, about once per millisecond."""
    client = families.aclient(port=server.port)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.0002)
            ticks += 1

    try:
        lock = redlease.AsyncLock(client, name, ttl=5.0)
        async with lock:
            pass  # connection made, script loaded
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        # CPU time, not wall time: a loaded machine may leave this process off the CPU
        # for tens of milliseconds, in which no loop turns and no time is spent polling.
        started = time.process_time()
        for _ in range(400):
            async with lock:
                pass
        elapsed = time.process_time() - started
        task.cancel()
        assert ticks >= min(3, int(elapsed / 0.005))
    finally:
        await client.aclose()


async def test_a_reply_read_partly_by_the_poll_is_finished_by_the_wait(
    server: servers.ServerProcess, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redlease._async.io import AsyncIO
    from redlease._rules.ops import Command

    value = os.urandom(600_000)
    writer = families.client(port=server.port)
    writer.set(name, value)
    polled = []
    real_poll = _backend_async.poll

    async def first_part_only(recv: Any, buffer: bytearray, reader: Any, record: Any) -> Any:
        deadline = time.monotonic() + 5
        while True:  # part of the reply (the poll's buffer is smaller than it)
            try:
                got = recv()
                break
            except BlockingIOError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.001)
        polled.append(got)
        reader.feed(buffer, 0, got)
        return _resp.NOT_ENOUGH  # as if the rest had not come yet

    client = families.aclient(port=server.port)
    io = AsyncIO(client)
    try:
        assert await io.execute(Command(("PING",), 5.0)) in (True, b"PONG")
        monkeypatch.setattr(_backend_async, "poll", first_part_only)
        assert await io.execute(Command(("GET", name), 10.0)) == value
        assert 0 < polled[0] < len(value)
        monkeypatch.setattr(_backend_async, "poll", real_poll)
        assert await io.execute(Command(("GET", name), 10.0)) == value
    finally:
        await client.aclose()
        writer.close()


async def test_pipelined_replies_are_read_in_order(server: servers.ServerProcess) -> None:
    """A reply that waited on the socket while the loop ran comes before a later one."""
    from redlease._async.io import AsyncIO

    client = families.aclient(port=server.port)
    pool = AsyncIO(client).pool
    assert pool is not None
    try:
        conn = await pool.take(5.0)
        assert conn is not None
        await conn.send(_resp.command(("PING",)))
        await asyncio.sleep(0.2)  # the reply is in while the loop runs
        await conn.send(_resp.command(("ECHO", "later")))
        time.sleep(0.2)  # noqa: ASYNC251 - the second reply waits on the socket too
        assert await conn.read(5.0) == b"PONG"
        assert await conn.read(5.0) == b"later"
        pool.give(conn)
    finally:
        await client.aclose()
