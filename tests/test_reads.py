"""How the drivers read replies: the sync driver's short poll before sleeping in the
kernel (which a slow link or a busy machine turns off by itself, and REDLEASE_SPIN_US
sets), and the asyncio driver's RESP3 reads (when the client asks for RESP3), which
skip push messages."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import redlease
from redlease import _io_sync, servers
from redlease.chaos.proxy import FaultProxy


def spin_record(client: redis.Redis) -> Any:
    return client.connection_pool._redlease_connections.spin  # type: ignore[attr-defined]


def test_a_slow_link_stops_the_spinning(server: servers.ServerProcess, name: str) -> None:
    with FaultProxy("127.0.0.1", server.port).start() as proxy:
        proxy.set_mode("delay", delay_ms=5)  # every reply far later than a spin lasts
        client = redis.Redis(port=proxy.port)
        lock = redlease.Lock(client, name, ttl=5.0)
        fences = []
        for _ in range(_io_sync.SPIN_MISSES):  # two reads each: acquire, release
            with lock as lease:
                fences.append(lease.fence)
        record = spin_record(client)
        assert record.rest > _io_sync.SPIN_REST - 2 * _io_sync.SPIN_MISSES
        resting = record.rest
        with lock:
            pass
        assert record.rest == resting - 2  # these reads slept at once
        assert fences == sorted(set(fences))
        client.close()


def test_spinning_off_gives_the_same_results(
    server: servers.ServerProcess, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis(port=server.port)
    lock = redlease.Lock(client, name, ttl=5.0)
    seen = []
    for budget in (0.0, _io_sync.SPIN_BUDGET, 0.0):
        monkeypatch.setattr(_io_sync, "SPIN_BUDGET", budget)
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
    assert _io_sync._spin_budget(None) == _io_sync.DEFAULT_SPIN_BUDGET
    assert _io_sync._spin_budget("0") == 0.0
    assert _io_sync._spin_budget("250") == pytest.approx(250e-6)
    for bad in ("-1", "fast", "1.5"):
        with pytest.warns(redlease.RedleaseWarning, match="REDLEASE_SPIN_US"):
            assert _io_sync._spin_budget(bad) == _io_sync.DEFAULT_SPIN_BUDGET
    shown = subprocess.run(
        [sys.executable, "-c", "from redlease import _io_sync; print(_io_sync.SPIN_BUDGET)"],
        env={**os.environ, "REDLEASE_SPIN_US": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip() == "0.0"


async def test_a_push_message_ahead_of_a_reply_is_skipped(
    server: servers.ServerProcess, name: str
) -> None:
    client = aredis.Redis(port=server.port, protocol=3)  # asked for: the driver keeps it
    other = aredis.Redis(port=server.port, protocol=2)
    try:
        lock = redlease.AsyncLock(client, name, ttl=5.0)
        async with lock as first:
            pass
        conn = client.connection_pool._redlease_connections._idle[-1]  # type: ignore[attr-defined]
        assert str(conn.protocol) == "3"
        # Make the server push an invalidation message on the driver's next connection.
        await conn.send_command("CLIENT", "TRACKING", "ON")
        await conn.read_response()
        await conn.send_command("GET", name + ":watched")
        await conn.read_response()
        await other.set(name + ":watched", "changed")
        async with lock as second:
            assert second.fence == first.fence + 1
        assert await other.exists("{" + name + "}") == 0
    finally:
        await client.aclose()
        await other.aclose()


async def test_a_short_read_after_a_long_one_keeps_its_own_deadline(
    server: servers.ServerProcess,
) -> None:
    """The asyncio reads of a connection share one timer, armed for the first read's
    deadline; a later read with a shorter one must still time out on its own."""
    from redlease._flows import Command
    from redlease._io_async import AsyncIO

    client = aredis.Redis(port=server.port)
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
