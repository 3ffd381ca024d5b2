"""redis-py (``redis``): redlease's own dependency, always installed, and the first family
loaded whenever one is (``_clients``)."""

from __future__ import annotations

from .family import Family, shaped_like_redis_py

PACKAGE = "redis"
SCHEMES: tuple[str, ...] = ("redis", "rediss", "unix")


def load() -> Family:
    """The family, its package imported now."""
    import redis
    import redis.asyncio

    return shaped_like_redis_py(
        "redis-py",
        redis,
        redis.asyncio,
        "Redis",
        "RedisError",
        SCHEMES,
        node_client="redis_connection",
    )
