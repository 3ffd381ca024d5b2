"""``try_acquire()`` never waits: against a server that is down (nothing listens) or hung
(a paused process: connections are accepted, nothing answers) it raises BackendError
within ``TRY_BOUND`` seconds, whatever the client's retry policy and the lock's ttl, on
both twins. An ``acquire`` that waits keeps its own bound (its timeout)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

import families
import redlease
from redlease._rules.flows import TRY_BOUND
from redlease.tools import servers

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
