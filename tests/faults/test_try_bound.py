"""``try_acquire()`` never waits: against a server that is down (nothing listens) or hung
(a paused process: connections are accepted, nothing answers) it raises BackendError
within ``TRY_BOUND`` seconds, whatever the client's retry policy and the lock's ttl, on
both twins. An ``acquire`` that waits keeps its own bound (its timeout), whatever the
back-off of the client's retry policy; the policy's count of retries is followed."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

import families
import redlease
from redlease._rules.flows import TRY_BOUND
from redlease.tools import servers
from waiting_helpers import lock_key

TTL = 30.0  # the reply bound of a lock's ops follows the ttl: a try must not
# Time the machine may add on top of the bound (2 cores, shared): far less than the
# 6-9 s a try took before it had a bound of its own.
SLACK = 1.0


@pytest.fixture
def paused(binary: servers.ServerBinary) -> Iterator[servers.ServerProcess]:
    """A server that was answering and then stopped answering (SIGSTOP)."""
    with servers.ServerProcess(binary) as proc:
        yield proc
        proc.resume()


def _timed(fn: Callable[[], Any]) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        fn()
    except BaseException as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


async def _atimed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        await fn()
    except BaseException as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def test_a_try_against_a_server_that_is_down_fails_at_once(server_kind: str) -> None:
    client = families.client(port=servers.free_port())
    lock = redlease.Lock(client, "down", ttl=TTL)
    for _ in range(3):  # the first try also looks at the server's settings
        took, error = _timed(lock.try_acquire)
        assert isinstance(error, redlease.BackendError), error
        assert took < TRY_BOUND + SLACK, f"try_acquire took {took:.2f}s"
    client.close()


def test_a_try_against_a_paused_server_gives_up_within_the_bound(
    paused: servers.ServerProcess,
) -> None:
    client = families.client(port=paused.port)
    lock = redlease.Lock(client, "paused", ttl=TTL)
    assert lock.try_acquire() is not None  # answered, and its connection is pooled
    paused.pause()
    took, error = _timed(lock.try_acquire)
    assert isinstance(error, redlease.BackendError), error
    assert took < TRY_BOUND + SLACK, f"try_acquire took {took:.2f}s"
    paused.resume()
    client.close()


async def test_an_async_try_against_a_server_that_is_down_fails_at_once(
    server_kind: str,
) -> None:
    client = families.aclient(port=servers.free_port())
    lock = redlease.AsyncLock(client, "down", ttl=TTL)
    for _ in range(3):
        took, error = await _atimed(lock.try_acquire)
        assert isinstance(error, redlease.BackendError), error
        assert took < TRY_BOUND + SLACK, f"try_acquire took {took:.2f}s"
    await client.aclose()


async def test_an_async_try_against_a_paused_server_gives_up_within_the_bound(
    paused: servers.ServerProcess,
) -> None:
    client = families.aclient(port=paused.port)
    lock = redlease.AsyncLock(client, "paused", ttl=TTL)
    assert await lock.try_acquire() is not None
    paused.pause()
    took, error = await _atimed(lock.try_acquire)
    assert isinstance(error, redlease.BackendError), error
    assert took < TRY_BOUND + SLACK, f"try_acquire took {took:.2f}s"
    paused.resume()
    await client.aclose()


# A policy whose back-off alone outlasts every bound below: one sleep of it, and the
# bound is gone (redis-py 8's default backs off for up to seconds too).
SLOW = 10.0


@pytest.mark.parametrize("timeout", [0.0, 0.3])
def test_acquire_keeps_its_bound_whatever_the_policys_back_off(
    server_kind: str, timeout: float
) -> None:
    client = families.client(port=servers.free_port(), retry=families.slow_retry(5, SLOW))
    lock = redlease.Lock(client, "down", ttl=TTL)
    took, error = _timed(lambda: lock.acquire(timeout=timeout))
    assert isinstance(error, redlease.BackendError), error
    # the bound, then half a second each for a try sent as it ran out and its clean-up
    assert took < timeout + TRY_BOUND + SLACK, f"acquire took {took:.2f}s"
    client.close()


@pytest.mark.parametrize("timeout", [0.0, 0.3])
async def test_an_async_acquire_keeps_its_bound_whatever_the_policys_back_off(
    server_kind: str, timeout: float
) -> None:
    client = families.aclient(port=servers.free_port(), retry=families.aslow_retry(5, SLOW))
    lock = redlease.AsyncLock(client, "down", ttl=TTL)
    took, error = await _atimed(lambda: lock.acquire(timeout=timeout))
    assert isinstance(error, redlease.BackendError), error
    assert took < timeout + TRY_BOUND + SLACK, f"acquire took {took:.2f}s"
    await client.aclose()


@pytest.fixture
def slammed() -> Iterator[tuple[int, list[int]]]:
    """A port whose listener closes every connection at once, and how many it took."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = [0]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            accepted[0] += 1
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1], accepted
    listener.close()
    thread.join(5)


def test_a_failed_connection_is_tried_again_as_often_as_the_policy_says(
    server_kind: str, slammed: tuple[int, list[int]]
) -> None:
    port, accepted = slammed
    tried = {}
    for retries in (0, 2, 5):
        accepted[0] = 0
        client = families.client(port=port, retry=families.retry(retries))
        with pytest.raises(redlease.BackendError):
            redlease.Lock(client, "slammed", ttl=TTL).acquire(timeout=0)
        tried[retries] = accepted[0]
        client.close()
    assert tried[0] >= 2, tried  # once more at least: a reply lost with its connection
    if not hasattr(families.retry(0), "get_retries"):  # (valkey-py: its count is private)
        assert tried[0] == tried[2] == tried[5], tried  # DEFAULT_RETRIES, the same for all
        return
    # one more per retry the policy allows
    assert tried[0] < tried[2] < tried[5], tried
    assert tried[5] - tried[2] >= 3, tried


def test_a_release_rides_out_a_restart_of_a_moment(binary: servers.ServerBinary) -> None:
    """The policy's few retries are spread over the release's bound (at most a second
    apart), so a server that restarts (keeping its data) while a release is on its way
    is waited out, not reported as down: retries spent in a few milliseconds could not."""
    with servers.ServerProcess(binary, appendfsync_always=True) as server:
        client = families.client(port=server.port, retry=families.retry(3))
        lease = redlease.Lock(client, "restarting", ttl=TTL).acquire(timeout=5)
        server.kill()
        back = threading.Timer(0.3, server.restart)  # down for 0.3 s and its start
        back.start()
        try:
            lease.release()  # no BackendError: a retry found the server back
        finally:
            back.join(30)
        assert client.exists(lock_key("restarting")) == 0
        client.close()
