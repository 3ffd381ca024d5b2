"""How redlease reaches the server behind a client the user passed in, read through the
public API of the client's family (``_clients``: redis-py, valkey-py) only.

A client is served one of three ways (its ``Route``), chosen once per client:

``SOCKET``
    A standalone client of a known family (``redis.Redis``, ``valkey.Valkey``, their
    asyncio twins) whose pool makes plain TCP or Unix socket connections: redlease
    opens sockets of its own with the client's settings (host and port or path, user
    and password or credential provider, db, client name, timeouts, keepalive) and
    speaks RESP2 on them. The fast path.
``CLASS``
    Any other connection class of such a client (TLS, Sentinel-managed, a subclass of
    the user's): redlease makes connections of its own with the client's connection
    class and settings, and uses their public methods (``connect``,
    ``send_packed_command``, ``can_read``, ``read_response``, ``disconnect``). A
    Sentinel-managed class asks the sentinels for the master on every connect.
``CLIENT``
    Anything else (Cluster clients, wrappers): the client's public command methods,
    with its own routing, timeouts and retries.

Connections of the first two routes are redlease's own, never the pool's: waiting on the
server never takes a slot from the application, whatever its pool's limit.
"""

from __future__ import annotations

import enum
import math
import sys
from dataclasses import dataclass, field
from typing import Any

from .._clients import family_of
from .._clients.family import Family

__all__ = [
    "Endpoint",
    "Route",
    "bounded",
    "endpoint_of",
    "node_endpoint",
    "node_of",
]


class Route(enum.Enum):
    """How redlease reaches a client's server: a socket of its own (SOCKET), the
    client's own connection class (CLASS), or the client's public methods (CLIENT)."""

    SOCKET = "socket"
    CLASS = "class"
    CLIENT = "client"


# Calls redlease makes at once through one client it serves through the client's own
# methods (the CLIENT route: a Cluster's): each takes a connection of the application's
# pool for its round trip, so thousands of callers must not make thousands at once.
CLIENT_CALLS = 8


# How often a failed connection is tried again when the client's retry policy does not
# say: one without a public ``get_retries()`` (valkey-py's, older redis-py's).
DEFAULT_RETRIES = 3


def retries_of(retry: Any) -> int:
    """How many times in a row a failed connection is tried again: as many as the
    client's retry policy says (a negative count: as long as the operation's bound
    lasts), DEFAULT_RETRIES for a policy that does not say, and at least once (a client
    without a policy too), so that a reply lost with its connection does not fail an
    operation."""
    get = getattr(retry, "get_retries", None)
    count = get() if callable(get) else (1 if retry is None else DEFAULT_RETRIES)
    return sys.maxsize if count < 0 else max(1, int(count))


@dataclass(frozen=True)
class Endpoint:
    """One server as a client reaches it."""

    route: Route
    label: str  # for messages: host:port, a socket path, or the client's type
    host: str = "localhost"
    port: int = 6379
    path: str | None = None
    username: str | None = None
    password: str | None = None
    credential_provider: Any = None
    db: int = 0
    client_name: str | None = None
    connect_timeout: float | None = None
    socket_timeout: float | None = None  # bounds every read, as the client's own would
    keepalive: bool = False
    keepalive_options: dict[Any, Any] = field(default_factory=dict)
    connection_class: Any = None  # CLASS: the client's connection class
    class_settings: dict[str, Any] = field(default_factory=dict)  # CLASS: its settings
    retry: Any = None  # the client's retry policy (its family's Retry), or None
    # A read's bound is the op's timeout, or this if shorter: a hung server is given up on
    # as soon as the client itself would (``socket_timeout``; none: no limit).
    read_limit: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        limit = math.inf if self.socket_timeout is None else float(self.socket_timeout)
        object.__setattr__(self, "read_limit", limit)  # (frozen)

    def credentials(self) -> tuple[str, ...]:
        """What AUTH takes: (password,) or (username, password); () for no AUTH."""
        if self.credential_provider is not None:
            return tuple(self.credential_provider.get_credentials())
        if self.password is None:
            return ()
        if self.username:
            return (self.username, self.password)
        return (self.password,)


def endpoint_of(client: Any, *, asyncio: bool) -> Endpoint:
    """How to reach the server behind ``client`` (sync, or asyncio when ``asyncio``)."""
    family = family_of(client)
    standalone = family is not None and isinstance(
        client, family.async_clients if asyncio else family.clients
    )
    if family is None or not standalone:
        return Endpoint(Route.CLIENT, type(client).__name__)
    get_retry = getattr(client, "get_retry", None)  # (a family without Retry: none)
    retry = get_retry() if callable(get_retry) else None
    reached = _reached(family, getattr(client, "connection_pool", None), retry, asyncio)
    return reached or Endpoint(Route.CLIENT, type(client).__name__)


def node_of(client: Any, key: str) -> Any:
    """The node (primary) that serves ``key``'s slot, if ``client`` is a Cluster client
    of a known family and knows it (its public ``get_node_from_key``); else None."""
    family = family_of(client)
    find = getattr(client, "get_node_from_key", None)
    if family is None or family.refusal(client) is not None or not callable(find):
        return None
    try:
        return find(key)
    except Exception:  # the client has not learnt the cluster's slots yet
        return None


def node_endpoint(client: Any, node: Any, *, asyncio: bool) -> Endpoint:
    """How to reach ``node`` of the Cluster ``client``: its settings are on the node
    (asyncio) or on the standalone client the node keeps (sync)."""
    family = family_of(client)
    if family is None:
        return Endpoint(Route.CLIENT, str(getattr(node, "name", "node")))
    if asyncio:
        source = node
    else:
        standalone = getattr(node, family.node_client, None) if family.node_client else None
        source = getattr(standalone, "connection_pool", None)
    reached = _reached(family, source, None, asyncio)
    return reached or Endpoint(Route.CLIENT, str(getattr(node, "name", "node")))


def _reached(family: Family, source: Any, retry: Any, asyncio: bool) -> Endpoint | None:
    """An endpoint from ``source`` (a connection pool, or an asyncio cluster node: its
    ``connection_class`` and settings); None when they cannot be read."""
    cls = getattr(source, "connection_class", None)
    settings = family.settings(source)
    if cls is None or settings is None:
        return None
    timeout = settings.get("socket_timeout")
    # (SO_RCVTIMEO, which bounds a blocking read of our own, takes a timeval on POSIX only)
    if cls in (family.async_plain if asyncio else family.plain) and sys.platform != "win32":
        path = settings.get("path")
        host, port = settings.get("host", "localhost"), int(settings.get("port", 6379))
        return Endpoint(
            Route.SOCKET,
            str(path) if path else f"{host}:{port}",
            host=host,
            port=port,
            path=path,
            username=settings.get("username"),
            password=settings.get("password"),
            credential_provider=settings.get("credential_provider"),
            db=int(settings.get("db") or 0),
            client_name=settings.get("client_name"),
            connect_timeout=settings.get("socket_connect_timeout") or timeout,
            socket_timeout=timeout,
            keepalive=bool(settings.get("socket_keepalive")),
            keepalive_options=_options(settings.get("socket_keepalive_options")),
            retry=retry,
        )
    label = (
        f"{settings['host']}:{settings.get('port', 6379)}"
        if "host" in settings
        else str(settings.get("path") or getattr(cls, "__name__", "connection"))
    )
    if "service_name" in settings:
        label = f"sentinel master {settings['service_name']!r}"
    return Endpoint(
        Route.CLASS,
        label,
        socket_timeout=timeout,
        connection_class=cls,
        class_settings=_class_settings(settings),
        retry=retry,
    )


def _options(value: object) -> dict[Any, Any]:
    # (redis-py 8 marks "the defaults" with a sentinel object: none of our own then)
    return dict(value) if isinstance(value, dict) else {}


def _class_settings(pool_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The settings of redlease's own connections of the client's class: the client's,
    minus what costs a round trip and means nothing to a lock, and with no retries of
    their own (redlease applies the client's policy around whole operations).

    A new connection must cost no round trip beyond TCP's (and AUTH, SELECT): each one
    counts against the op's bound and a lease's elapsed time. So no CLIENT SETINFO, and
    RESP2 unless the client asked for RESP3 (redis-py 8 would otherwise send HELLO 3 and
    CLIENT MAINT_NOTIFICATIONS first); replies as bytes."""
    settings = dict(pool_kwargs)
    for key in ("driver_info", "lib_name", "lib_version"):
        if key in settings:
            settings[key] = None
    if settings.get("protocol") is None:
        settings["protocol"] = 2
        if "maint_notifications_config" in settings:
            settings["maint_notifications_config"] = None
    settings["decode_responses"] = False
    settings["retry"] = None
    return settings


def bounded(settings: dict[str, Any], timeout: float) -> dict[str, Any]:
    """CLASS ``settings`` for one new connection: its handshake bounded by ``timeout``."""
    kwargs = dict(settings)
    for key in ("socket_timeout", "socket_connect_timeout"):
        configured = kwargs.get(key)
        kwargs[key] = timeout if configured is None else min(configured, timeout)
    return kwargs
