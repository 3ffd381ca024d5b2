"""valkey-py (``valkey``): the Valkey project's fork of redis-py, served when installed."""

from __future__ import annotations

from .family import Family, shaped_like_redis_py

FAMILY: Family | None
try:
    import valkey
    import valkey.asyncio
except ImportError:
    FAMILY = None
else:
    FAMILY = shaped_like_redis_py(
        "valkey-py",
        valkey,
        valkey.asyncio,
        "Valkey",
        "ValkeyError",
        ("valkey", "valkeys"),
        node_client="valkey_connection",
    )
