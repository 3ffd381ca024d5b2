"""redis-py (``redis``): redlease's own dependency, always present."""

from __future__ import annotations

import redis
import redis.asyncio

from .family import shaped_like_redis_py

FAMILY = shaped_like_redis_py(
    "redis-py",
    redis,
    redis.asyncio,
    "Redis",
    "RedisError",
    ("redis", "rediss", "unix"),
    node_client="redis_connection",
)
