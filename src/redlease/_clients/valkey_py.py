"""valkey-py (``valkey``): the Valkey project's fork of redis-py, served when installed."""

from __future__ import annotations

from .family import Family, shaped_like_redis_py

PACKAGE = "valkey"
SCHEMES: tuple[str, ...] = ("valkey", "valkeys")


def load() -> Family:
    """The family, its package imported now; ImportError if it is not installed."""
    import valkey
    import valkey.asyncio

    return shaped_like_redis_py(
        "valkey-py",
        valkey,
        valkey.asyncio,
        "Valkey",
        "ValkeyError",
        SCHEMES,
        node_client="valkey_connection",
    )
