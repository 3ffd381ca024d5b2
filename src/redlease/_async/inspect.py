"""``aread_info``: one read of what a name holds and who waits for it (the rules, and
what the reply means, are in ``_rules.inspect``). Written once, as asyncio code;
``scripts/unasync.py`` generates the blocking twin (``_sync.inspect``)."""

from __future__ import annotations

from typing import Any

from .._clients.checks import check_client
from .._rules.inspect import READ_TIMEOUT, TWINS, LockInfo, checked, inspect
from .backend import ASYNC
from .io import AsyncIO


async def aread_info(
    client: Any, name: str, *, kind: str = "lock", prefix: str = "redlease:"
) -> LockInfo:
    """What the ``kind`` named ``name`` holds and who waits for it, now (a client of this
    flavour: standalone, Sentinel's ``master_for``, Cluster). One read-only script run.
    Raises InvalidArgument for a bad ``name``, ``prefix`` or ``kind``, or a client it
    cannot serve; BackendError if the server fails."""
    check_client(client, want_async=ASYNC, **TWINS)
    keys, name, kind = checked(name, kind, prefix)
    flow = inspect(keys, name, kind, READ_TIMEOUT)
    return await AsyncIO(client).run(flow, f"inspect {name!r}")
