"""What redlease knows of one client family (redis-py, a fork of it, ...): the types that
say a client is one of its, and its errors. All of it is the family's public API."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


def _connection_kwargs(pool: Any) -> dict[str, Any] | None:
    settings = getattr(pool, "connection_kwargs", None)
    return settings if isinstance(settings, dict) else None


def _served(client: Any) -> str | None:
    return None


@dataclass(frozen=True)
class Errors:
    """A family's exception classes, by what they mean to a lock."""

    base: type[Exception]  # every error of the family derives from it
    connection: type[Exception]  # the server cannot be reached (retried by its policy)
    timeout: type[Exception] | None  # no reply in time (retried by its policy)
    response: type[Exception]  # an error reply
    noscript: type[Exception]  # the server does not know the script
    readonly: type[Exception]  # a replica refuses writes
    loading: type[Exception]  # the server is loading its data set
    denied: tuple[type[Exception], ...]  # authentication or ACL refusals
    oom: type[Exception] | None = None  # out of memory (else told by the reply's text)
    protocol: tuple[type[Exception], ...] = ()  # a reply that is not RESP: not a server


@dataclass(frozen=True)
class Family:
    """One client family. ``clients`` / ``async_clients`` are its standalone client
    types: ones with a connection pool whose ``connection_class`` and
    ``connection_kwargs`` say how to reach the server, and ``get_retry()``. ``plain`` /
    ``async_plain`` are the connection classes (plain TCP, Unix socket) that redlease
    may replace by sockets of its own with the same settings."""

    name: str
    package: str  # its top-level module: clients of other types from it are its too
    schemes: tuple[str, ...]  # URL schemes that ask for this family (``from_url``)
    clients: tuple[type, ...]
    async_clients: tuple[type, ...]
    plain: tuple[type, ...]
    async_plain: tuple[type, ...]
    errors: Errors
    # The pool's settings in redis-py's shape (host, port or path, password, db,
    # socket_timeout...), or None when they cannot be put so; and why a client of this
    # family cannot be served, if it cannot.
    settings: Callable[[Any], dict[str, Any] | None] = field(default=_connection_kwargs)
    refusal: Callable[[Any], str | None] = field(default=_served)
    # The attribute of a sync Cluster client's node that holds the node's standalone client
    node_client: str = ""

    def owns(self, client: object) -> bool:
        module = type(client).__module__
        return module == self.package or module.startswith(self.package + ".")


def shaped_like_redis_py(
    name: str,
    sync: ModuleType,
    asyncio: ModuleType,
    client: str,
    base_error: str,
    schemes: tuple[str, ...],
    node_client: str,
) -> Family:
    """A family with redis-py's layout (redis-py itself and its forks): ``sync.<client>``
    and ``asyncio.<client>``, ``Connection`` and ``UnixDomainSocketConnection`` in both,
    the errors in ``sync.exceptions``."""
    x = sync.exceptions
    return Family(
        name=name,
        package=sync.__name__,
        schemes=schemes,
        clients=(getattr(sync, client),),
        async_clients=(getattr(asyncio, client),),
        plain=(sync.Connection, sync.UnixDomainSocketConnection),
        async_plain=(asyncio.Connection, asyncio.UnixDomainSocketConnection),
        errors=Errors(
            base=getattr(x, base_error),
            connection=x.ConnectionError,
            timeout=x.TimeoutError,
            response=x.ResponseError,
            noscript=x.NoScriptError,
            readonly=x.ReadOnlyError,
            loading=x.BusyLoadingError,
            denied=(x.AuthenticationError, x.NoPermissionError),
            oom=getattr(x, "OutOfMemoryError", None),
            protocol=(x.InvalidResponse,),
        ),
        node_client=node_client,
    )
