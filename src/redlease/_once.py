"""``redlease.once``: a scheduled job that runs once across a fleet, for either flavour
of client (``Once`` for a sync one, ``AsyncOnce`` for an asyncio one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

from ._async.once import AsyncOnce
from ._base.types import OnLost, Seconds
from ._clients.checks import is_async_client
from ._sync.once import Once

if TYPE_CHECKING:  # (no client library is imported until a client is met)
    import redis
    import redis.asyncio


@overload
def once(
    client: redis.asyncio.Redis | redis.asyncio.RedisCluster,
    name: str,
    *,
    at_most: Seconds,
    at_least: Seconds = 0,
    every: Seconds | None = None,
    ttl: Seconds | None = None,
    fence_as: str | None = None,
    on_lost: OnLost | None = None,
    prefix: str = "redlease:",
) -> AsyncOnce: ...


@overload
def once(
    client: redis.Redis | redis.RedisCluster,
    name: str,
    *,
    at_most: Seconds,
    at_least: Seconds = 0,
    every: Seconds | None = None,
    ttl: Seconds | None = None,
    fence_as: str | None = None,
    on_lost: OnLost | None = None,
    prefix: str = "redlease:",
) -> Once: ...


@overload
def once(
    client: Any,
    name: str,
    *,
    at_most: Seconds,
    at_least: Seconds = 0,
    every: Seconds | None = None,
    ttl: Seconds | None = None,
    fence_as: str | None = None,
    on_lost: OnLost | None = None,
    prefix: str = "redlease:",
) -> Once | AsyncOnce: ...


def once(
    client: Any,
    name: str,
    *,
    at_most: Seconds,
    at_least: Seconds = 0,
    every: Seconds | None = None,
    ttl: Seconds | None = None,
    fence_as: str | None = None,
    on_lost: OnLost | None = None,
    prefix: str = "redlease:",
) -> Once | AsyncOnce:
    """A scheduled job that runs once across every process that calls it: ``Once`` for a
    sync client, ``AsyncOnce`` for an asyncio one (see them for the options). Use it as a
    decorator or a context manager::

        @redlease.once(r, "nightly-report", at_most=600, at_least=30)
        def nightly_report(): ...
    """
    kind = AsyncOnce if is_async_client(client) else Once
    return kind(
        client,
        name,
        at_most=at_most,
        at_least=at_least,
        every=every,
        ttl=ttl,
        fence_as=fence_as,
        on_lost=on_lost,
        prefix=prefix,
    )
