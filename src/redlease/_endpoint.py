"""How redlease reaches the server behind a client the user passed in: everything it knows
of the redis-py family, in one place, read through public API only.

A client is served one of three ways, chosen once per client:

``SOCKET``
    A plain ``redis.Redis`` / ``redis.asyncio.Redis`` whose pool makes plain TCP or Unix
    socket connections: redlease opens sockets of its own with the client's settings
    (host and port or path, user and password or credential provider, db, client name,
    timeouts, keepalive) and speaks RESP2 on them. The fast path.
``CLASS``
    Any other connection class of such a client (TLS, Sentinel-managed, a subclass of
    the user's): redlease makes connections of its own with the client's connection
    class and settings, and uses their public methods (``connect``,
    ``send_packed_command``, ``can_read``, ``read_response``, ``disconnect``). A
    Sentinel-managed class asks the sentinels for the master on every connect.
``CLIENT``
    Anything else (``RedisCluster``, wrappers): the client's public command methods,
    with its own routing, timeouts and retries.

Connections of the first two kinds are redlease's own, never the pool's: waiting on the
server never takes a slot from the application, whatever its pool's limit.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aredis
from redis import exceptions as rx

from ._resp import ReplyError


class Kind(enum.Enum):
    SOCKET = "socket"
    CLASS = "class"
    CLIENT = "client"


# The connection classes whose settings redlease knows how to open a socket with itself.
_PLAIN_SYNC = (redis.Connection, redis.UnixDomainSocketConnection)
_PLAIN_ASYNC = (aredis.Connection, aredis.UnixDomainSocketConnection)


@dataclass(frozen=True)
class Endpoint:
    """One server as a client reaches it."""

    kind: Kind
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
    retry: Any = None  # the client's retry policy (redis-py Retry), or None

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
    family = aredis.Redis if asyncio else redis.Redis
    pool = getattr(client, "connection_pool", None)
    cls = getattr(pool, "connection_class", None)
    settings = getattr(pool, "connection_kwargs", None)
    if not isinstance(client, family) or cls is None or not isinstance(settings, dict):
        return Endpoint(Kind.CLIENT, type(client).__name__)
    retry = client.get_retry()
    timeout = settings.get("socket_timeout")
    # (SO_RCVTIMEO, which bounds a blocking read of our own, takes a timeval on POSIX only)
    if cls in (_PLAIN_ASYNC if asyncio else _PLAIN_SYNC) and sys.platform != "win32":
        path = settings.get("path")
        host, port = settings.get("host", "localhost"), int(settings.get("port", 6379))
        return Endpoint(
            Kind.SOCKET,
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
        Kind.CLASS,
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


def read_bound(endpoint: Endpoint, timeout: float) -> float:
    """A read's bound: the op's ``timeout``, or the client's ``socket_timeout`` if shorter
    (a hung server is given up on as soon as the client itself would)."""
    limit = endpoint.socket_timeout
    return timeout if limit is None or limit >= timeout else float(limit)


# The client family's own connection errors: its retry policy retries exactly these.
ConnectionFailed = rx.ConnectionError
ReplyTimedOut = rx.TimeoutError
# An error reply: ours (ReplyError) or one a CLASS connection or client raised.
REPLY_ERRORS: tuple[type[Exception], ...] = (ReplyError, rx.ResponseError)


def is_noscript(exc: BaseException) -> bool:
    """The server does not know the script (restarted, SCRIPT FLUSH, a promoted replica)."""
    return isinstance(exc, rx.NoScriptError) or (
        isinstance(exc, ReplyError) and exc.code == "NOSCRIPT"
    )


def is_unblocked(exc: BaseException) -> bool:
    """A blocked command was ended by the server because it changed role (a failover)."""
    if isinstance(exc, ReplyError):
        return exc.code == "UNBLOCKED"
    return isinstance(exc, rx.ResponseError) and str(exc).startswith("UNBLOCKED")
