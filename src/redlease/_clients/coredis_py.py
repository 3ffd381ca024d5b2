"""coredis (``coredis``): a typed asyncio client, served when installed, for standalone
``coredis.Redis`` clients on plain TCP or a Unix socket. redlease reads the server's
address from the pool's public ``location`` and the rest from its ``connection_kwargs``,
and talks on sockets of its own; it never calls the client, whose methods take other
signatures than redis-py's. Cluster, Sentinel and TLS clients are refused by name."""

from __future__ import annotations

from typing import Any

from .family import Errors, Family

PACKAGE = "coredis"
SCHEMES: tuple[str, ...] = ()


def _settings(pool: Any) -> dict[str, Any] | None:
    kwargs = getattr(pool, "connection_kwargs", None)
    location = getattr(pool, "location", None)
    if not isinstance(kwargs, dict) or location is None:
        return None
    settings = {
        "db": kwargs.get("db") or 0,
        "username": kwargs.get("username"),
        "password": kwargs.get("password"),
        "client_name": kwargs.get("client_name"),
        "socket_timeout": kwargs.get("stream_timeout"),
        "socket_connect_timeout": kwargs.get("connect_timeout"),
    }
    if hasattr(location, "path"):
        settings["path"] = location.path
    else:
        settings["host"], settings["port"] = location.host, location.port
    return settings


def load() -> Family:
    """The family, its package imported now; ImportError if it is not installed."""
    import coredis
    import coredis.exceptions as x

    def refusal(client: Any) -> str | None:
        if not isinstance(client, coredis.Redis):
            return "only standalone coredis.Redis clients are served (not Cluster or Sentinel)"
        kwargs = getattr(client.connection_pool, "connection_kwargs", None) or {}
        if kwargs.get("ssl_context") is not None:
            return "coredis clients over TLS are not served yet"
        if kwargs.get("credential_provider") is not None:
            return "coredis credential providers are not served yet"
        return None

    return Family(
        name="coredis",
        package=PACKAGE,
        schemes=SCHEMES,
        clients=(),
        async_clients=(coredis.Redis,),
        plain=(),
        async_plain=(
            coredis.connection.TCPConnection,
            coredis.connection.UnixDomainSocketConnection,
        ),
        errors=Errors(
            base=x.RedisError,
            connection=x.ConnectionError,
            timeout=None,  # it raises the builtin TimeoutError
            response=x.ResponseError,
            noscript=x.NoScriptError,
            readonly=x.ReadOnlyError,
            loading=x.BusyLoadingError,
            denied=(x.AuthenticationError, x.AuthorizationError),
            protocol=(x.InvalidResponse, x.ProtocolError),
        ),
        settings=_settings,
        refusal=refusal,
    )
