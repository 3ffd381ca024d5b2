"""The API reads as public: classes and errors are named ``redlease.X`` wherever they
show (tracebacks, reprs, pickles); ``with`` on an asyncio object says to use ``async
with`` (a blocking one keeps no ``__aenter__``: see ``_base.misuse``); a bad duration reads as a
duration; warnings point at the caller's own line and are given
once per process for each server."""

from __future__ import annotations

import asyncio
import pickle
import traceback
import types
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import families
import redlease
from redlease.tools import servers


def test_every_public_name_reads_as_redlease() -> None:
    for name in redlease.__all__:
        public = getattr(redlease, name)
        if isinstance(public, (type, types.FunctionType)) and not isinstance(
            public, types.GenericAlias
        ):  # (not Seconds and its kin)
            assert public.__module__ == "redlease", name
    said = "".join(traceback.format_exception_only(redlease.LockLost("gone")))
    assert said == "redlease.LockLost: gone\n"
    again = pickle.loads(pickle.dumps(redlease.AcquireTimeout("busy")))
    assert type(again) is redlease.AcquireTimeout
    assert pickle.loads(pickle.dumps(redlease.Lock)) is redlease.Lock


def test_a_negative_timedelta_reads_as_seconds() -> None:
    with pytest.raises(redlease.InvalidArgument, match=r"got -5 s \(a timedelta\)"):
        redlease.Lock(redis.Redis(), "x", ttl=timedelta(seconds=-5))


def _asyncio(a: aredis.Redis, port: int, name: str) -> Iterator[tuple[str, Any]]:
    yield "AsyncLock", redlease.AsyncLock(a, name)
    yield "AsyncSemaphore", redlease.AsyncSemaphore(a, name + ":s", limit=2)
    yield "AsyncReadWriteSide", redlease.AsyncReadWriteLock(a, name + ":rw").read
    yield "AsyncMultiLock", redlease.AsyncMultiLock(a, [name + ":a", name + ":b"])
    yield "AsyncOnce", redlease.AsyncOnce(a, name + ":job", at_most=5.0)
    nodes = [families.aclient(port=port, db=db) for db in (1, 2, 3)]
    yield "AsyncRedlock", redlease.AsyncRedlock(nodes, name + ":q")


def test_a_blocking_object_is_not_taken_for_an_asyncio_one(r: redis.Redis, name: str) -> None:
    """Code that takes either kind of context manager asks for ``__aenter__`` first: a
    blocking lock or lease has none, so ``async with`` on it keeps Python's message."""
    lock = redlease.Lock(r, name)
    lease = lock.acquire()
    for blocking in (lock, lease, redlease.ReadWriteLock(r, name + ":rw").read):
        assert not hasattr(blocking, "__aenter__")
    lease.release()


@pytest.mark.filterwarnings("ignore::redlease.RedleaseWarning")
def test_with_on_an_asyncio_object_says_use_async_with(
    server: servers.ServerProcess, name: str
) -> None:
    async def main() -> None:
        a = families.aclient(port=server.port)
        wrong = "use `async with`, not `with`"
        for shown, lock in _asyncio(a, server.port, name):
            with pytest.raises(redlease.InvalidArgument, match=wrong) as e, lock:
                raise AssertionError("entered")  # (type checkers flag the `with`, as they should)
            assert str(e.value).startswith(shown), e.value
            assert "blocking code uses" in str(e.value)
        lease = await redlease.AsyncLock(a, name).acquire()
        with (
            pytest.raises(redlease.InvalidArgument, match=r"AsyncLease is for asyncio.*Lease"),
            lease,  # type: ignore[attr-defined]
        ):
            raise AssertionError("entered")
        await lease.release()
        await a.aclose()

    asyncio.run(main())


@pytest.fixture
def evicting(binary: servers.ServerBinary) -> Iterator[servers.ServerProcess]:
    """A server that may evict lock keys (so redlease warns about it)."""
    with servers.ServerProcess(binary) as proc:
        client = redis.Redis(port=proc.port)
        client.config_set("maxmemory-policy", "allkeys-lru")
        client.close()
        yield proc


def _said(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if "allkeys-lru" in str(w.message)]


def test_a_server_warning_points_at_the_caller_once_per_server(
    evicting: servers.ServerProcess,
) -> None:
    make: list[Callable[[], redis.Redis]] = [
        lambda: families.client(port=evicting.port) for _ in range(3)
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for new_client in make:  # three clients, three lock objects: one server
            client = new_client()
            redlease.Lock(client, "x").acquire().release()
            client.close()
    said = _said(caught)
    assert len(said) == 1, [str(w.message) for w in said]
    assert said[0].filename == __file__
    assert str(evicting.port) in str(said[0].message)


def test_a_server_warning_points_at_the_caller_asyncio(evicting: servers.ServerProcess) -> None:
    async def main() -> None:
        a = families.aclient(port=evicting.port)
        await (await redlease.AsyncLock(a, "x").acquire()).release()
        await a.aclose()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
    said = _said(caught)
    assert len(said) == 1
    assert said[0].filename == __file__
