"""The checks of the client a caller gives redlease, once for every entry point (the
locks, ``read_info``, Redlock's nodes): a client of a family redlease serves, of the
flavour (sync or asyncio) the caller needs; and a Redlock's nodes: distinct servers, and
what each is called."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from .._base.errors import InvalidArgument
from .registry import family_of, refusal


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


def node_identity(client: Any) -> tuple[object, ...]:
    """Where a node client connects (host, port, db; or socket path, db), as its family
    reads its pool's settings: two clients of one server are one node. A client whose
    settings cannot be read is a node of its own."""
    family = family_of(client)
    pool = getattr(client, "connection_pool", None)
    if family is not None:
        kwargs = family.settings(pool) or {}
    else:  # a client of no known family: its pool's settings, if shaped as redis-py's
        found = getattr(pool, "connection_kwargs", None)
        kwargs = found if isinstance(found, dict) else {}
    if "host" in kwargs:
        return (kwargs["host"], kwargs.get("port", 6379), kwargs.get("db", 0))
    if "path" in kwargs:
        return (kwargs["path"], kwargs.get("db", 0))
    return (id(client),)


def node_name(client: Any) -> str:
    ident = node_identity(client)
    if len(ident) == 3:
        return f"{ident[0]}:{ident[1]}/{ident[2]}"
    if len(ident) == 2:
        return f"{ident[0]}/{ident[1]}"
    return f"{type(client).__name__}@{id(client):x}"


def check_nodes(nodes: object, *, want_async: bool) -> list[Any]:
    """The node clients: a non-empty list of distinct clients, all sync or all asyncio."""
    if callable(getattr(nodes, "execute_command", None)):
        raise InvalidArgument(
            "nodes must be a list of clients (one per independent server), not a single "
            "client; use Lock for one server"
        )
    if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Sequence):
        raise InvalidArgument(f"nodes must be a list of clients, not {type(nodes).__name__}")
    clients = list(nodes)
    if not clients:
        raise InvalidArgument("nodes must not be empty: Redlock needs at least one server")
    kinds: dict[bool, int] = {}
    for i, client in enumerate(clients):
        check_served(client, f"nodes[{i}]")
        kinds.setdefault(is_async_client(client), i)
        ident = node_identity(client)
        for j, other in enumerate(clients[:i]):
            if other is client or node_identity(other) == ident:
                raise InvalidArgument(
                    f"nodes[{j}] and nodes[{i}] are the same node ({node_name(client)}): "
                    "Redlock needs distinct, independent servers"
                )
    if len(kinds) > 1:
        raise InvalidArgument(
            f"nodes mixes sync and asyncio clients (nodes[{kinds[False]}] is sync, "
            f"nodes[{kinds[True]}] is asyncio)"
        )
    if want_async not in kinds:
        if want_async:
            raise InvalidArgument(
                "nodes must be asyncio clients (redis.asyncio, valkey.asyncio) for "
                "AsyncRedlock; use Redlock with sync clients"
            )
        raise InvalidArgument(
            "nodes must be sync clients (redis.Redis, valkey.Valkey) for Redlock; use "
            "AsyncRedlock with asyncio clients"
        )
    return clients
