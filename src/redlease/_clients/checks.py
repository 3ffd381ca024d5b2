"""The checks of the client a caller gives redlease, once for every entry point (the
locks, ``read_info``, Redlock's nodes): a client of a family redlease serves, of the
flavour (sync or asyncio) the caller needs."""

from __future__ import annotations

import inspect

from .._base.errors import InvalidArgument
from . import refusal


def is_async_client(client: object) -> bool:
    return inspect.iscoroutinefunction(getattr(client, "execute_command", None))


def check_served(client: object, what: str) -> None:
    """Refuse what redlease cannot serve, naming the argument (``what``) and the client."""
    refused = refusal(client)
    if refused is not None:
        raise InvalidArgument(f"{what} is refused: {refused}")
    if isinstance(client, type):
        raise InvalidArgument(f"{what} must be a client, not the class {client.__name__}")
    if callable(getattr(client, "master_for", None)):
        raise InvalidArgument(
            f"{what} is a Sentinel manager: pass the master's client, "
            f"sentinel.master_for(service_name)"
        )
    if not callable(getattr(client, "execute_command", None)):
        raise InvalidArgument(
            f"{what} must be a redis-py or valkey-py client, not {type(client).__name__}"
        )


def check_client(
    client: object, *, want_async: bool, sync_twin: str = "Lock", async_twin: str = ""
) -> None:
    """Refuse a client the caller cannot serve: of a family redlease does not serve, or
    of the other flavour (a sync client for the asyncio twin, and the reverse)."""
    check_served(client, "client")
    if is_async_client(client) != want_async:
        async_twin = async_twin or f"Async{sync_twin}"
        if want_async:
            raise InvalidArgument(
                "client must be an asyncio client (redis.asyncio, valkey.asyncio) for "
                f"{async_twin}; use {sync_twin} with a sync client"
            )
        raise InvalidArgument(
            f"client must be a sync client (redis.Redis, valkey.Valkey) for {sync_twin}; "
            f"use {async_twin} with an asyncio client"
        )
