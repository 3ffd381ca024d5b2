"""Server failures are reported clearly, never as "acquired", and never leave a lock
behind without a TTL: down, paused, read-only replica, out of memory, evicting, scripts
flushed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import families
import redlease
from redlease.tools import servers
from waiting_helpers import lock_key


@pytest.fixture
def own_server(server_kind: str) -> Iterator[servers.ServerProcess]:
    """A server of the session's kind that this test may break."""
    with servers.ServerProcess(servers.find_binary(server_kind)) as proc:
        yield proc


def test_server_down_is_a_backend_error_with_cause() -> None:
    client = families.client(port=servers.free_port(), socket_connect_timeout=1)
    with pytest.raises(redlease.BackendError, match="cannot be reached") as caught:
        redlease.Lock(client, "x").acquire(timeout=1)
    assert isinstance(caught.value.__cause__, families.errors().ConnectionError)
    client.close()


def test_paused_server_times_out_and_leaves_only_expiring_keys(
    own_server: servers.ServerProcess,
) -> None:
    client = families.client(port=own_server.port)
    client.ping()
    own_server.pause()
    started = time.monotonic()
    try:
        with pytest.raises(redlease.BackendError, match="did not answer in time"):
            redlease.Lock(client, "paused", ttl=0.5).acquire(timeout=5)
    finally:
        own_server.resume()
    assert time.monotonic() - started < 10
    time.sleep(0.2)
    assert client.pttl(lock_key("paused")) != -1  # applied late or not at all, never without TTL
    client.close()


def test_read_only_replica_is_named(own_server: servers.ServerProcess, server_kind: str) -> None:
    replica = servers.ServerProcess(
        servers.find_binary(server_kind),
        extra_args=["--replicaof", "127.0.0.1", str(own_server.port)],
    ).start()
    try:
        client = families.client(port=replica.port)
        with pytest.raises(redlease.BackendError, match="read-only replica"):
            redlease.Lock(client, "x").acquire(timeout=1)
        assert client.exists(lock_key("x")) == 0
        client.close()
    finally:
        replica.stop()


def test_out_of_memory_is_named(own_server: servers.ServerProcess) -> None:
    client = families.client(port=own_server.port)
    client.config_set("maxmemory", 1)
    try:
        with pytest.raises(redlease.BackendError, match="out of memory"):
            redlease.Lock(client, "x").acquire(timeout=1)
    finally:
        client.config_set("maxmemory", 0)
    client.close()


def test_key_evicting_policy_warns(own_server: servers.ServerProcess) -> None:
    client = families.client(port=own_server.port)
    client.config_set("maxmemory-policy", "allkeys-lru")
    with pytest.warns(redlease.RedleaseWarning, match="allkeys-lru"):
        lease = redlease.Lock(client, "x").acquire()
    lease.release()
    client.close()


def test_scripts_survive_script_flush(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name)
    lease = lock.acquire()
    r.script_flush()
    lease.extend()
    lease.release()
    r.script_flush()
    lock.acquire().release()


def test_decoded_client_works(server: servers.ServerProcess, name: str) -> None:
    client = families.client(port=server.port, decode_responses=True)
    lock = redlease.Lock(client, name)
    with lock as lease:
        assert client.get(lock_key(name)) == lease.token
    client.close()


# What a listener that is not Redis answers to everything: an HTTP server's refusal.
_HTTP = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"


def _answering(answer: bytes) -> tuple[Any, int]:
    """A listener on a free port that sends ``answer`` for every chunk it is sent."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):  # (a client may reset it)
                while conn.recv(65536):
                    conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return listener, int(listener.getsockname()[1])


def test_a_port_that_is_not_redis_is_a_backend_error_saying_so() -> None:
    listener, port = _answering(_HTTP)
    try:
        for timeout in (0.0, None):  # a try, and a wait (not retried: it will not pass)
            started = time.monotonic()
            lock = redlease.Lock(families.client(port=port), "not-redis", ttl=30.0)
            with pytest.raises(redlease.BackendError, match="does not speak Redis") as told:
                lock.acquire(timeout=timeout)
            assert f":{port}" in str(told.value)
            assert time.monotonic() - started < 5.0  # (a wait would retry for its ttl)
    finally:
        listener.close()


async def test_a_port_that_is_not_redis_is_a_backend_error_saying_so_asyncio() -> None:
    listener, port = _answering(_HTTP)
    try:
        lock = redlease.AsyncLock(families.aclient(port=port), "not-redis", ttl=30.0)
        with pytest.raises(redlease.BackendError, match="does not speak Redis"):
            await lock.try_acquire()
    finally:
        listener.close()


@pytest.mark.parametrize("reader", ["python", "hiredis"])
def test_a_reply_that_is_not_resp_is_not_redis(reader: str) -> None:
    from redlease._clients import NotRedis
    from redlease._wire import resp

    hiredis = pytest.importorskip("hiredis") if reader == "hiredis" else None
    parser = resp.PyReader() if hiredis is None else resp.new_reader()
    data = bytearray(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    with pytest.raises(NotRedis, match="not RESP"):
        resp.fed(len(data), data, parser)
    ok = bytearray(b"+OK\r\n")
    assert resp.fed(len(ok), ok, resp.PyReader() if hiredis is None else resp.new_reader())


def test_junk_after_a_reply_is_not_redis_on_the_next_read() -> None:
    """A reply followed by bytes that are not RESP, in one chunk: the next read of that
    connection, which finds them in its reader, says so too (it raised the parser's own
    error, a traceback in the CLI)."""
    from redlease._rules.ops import Command
    from redlease._sync.io import IO

    listener, port = _answering(b"+PONG\r\n?garbage\r\n")

    def ping() -> Any:
        return (yield Command(("PING",), 2.0))

    io = IO(families.client(port=port))
    try:
        assert io.run(ping(), "ping") == b"PONG"
        with pytest.raises(redlease.BackendError, match="does not speak Redis"):
            io.run(ping(), "ping")
    finally:
        listener.close()
