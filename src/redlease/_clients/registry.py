"""Every family together: which family a client is of (``family_of``), the errors of
all of them as one set of classes to catch (``caught()``), each family loaded when its
package is first imported, a client made from a URL (``from_url``), and the clients
redlease refuses (``refusal``). The package's docstring says why a family loads late."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .._base import fork as _fork
from .._base.errors import warn
from . import coredis_py, redis_py, valkey_py
from .family import Family

if TYPE_CHECKING:
    import redis.exceptions


Classes = tuple[type[Exception], ...]


@dataclass(frozen=True)
class Caught:
    """The errors of every family loaded, by what they mean to a lock (``Errors``)."""

    base: Classes = ()
    connection: Classes = ()
    timeout: Classes = ()
    response: Classes = ()
    noscript: Classes = ()
    readonly: Classes = ()
    loading: Classes = ()
    oom: Classes = ()
    denied: Classes = ()
    protocol: Classes = ()  # (and NotRedis, redlease's own connections')


# What redlease's own connections raise: a connection error, or a timeout, in the terms
# of every family at once, so that whichever family's retry policy the client brought
# retries it, as it would its own (and its except clauses catch it). Their bases are the
# loaded families' classes, set as each family is loaded (``_load``); until the first is,
# a stand-in (a Python-level class, so that it has the layout of the families' classes).
class _NoFamilyYet(Exception):
    pass


if TYPE_CHECKING:

    class ConnectionFailed(redis.exceptions.ConnectionError): ...

    class ReplyTimedOut(redis.exceptions.TimeoutError): ...

else:

    class ConnectionFailed(_NoFamilyYet):
        pass

    class ReplyTimedOut(_NoFamilyYet):
        pass


class NotRedis(ConnectionFailed):
    """What answers on the server's address sent bytes that are not a Redis reply (RESP):
    it is something else (an HTTP server, another database), never worth a retry."""


class _File(Protocol):
    """A family's file: its package, the URL schemes that ask for it, and ``load()``,
    which imports the package (ImportError if it is not installed)."""

    PACKAGE: str
    SCHEMES: tuple[str, ...]

    def load(self) -> Family: ...


# The family files, redis-py first: ``family_of`` asks them in this order, and errors
# and bases are listed in it.
_FILES: tuple[_File, ...] = (redis_py, valkey_py, coredis_py)

_loading = threading.RLock()
_tried: dict[str, Family | None] = {}  # by package: its family, None if not installed
_families: tuple[Family, ...] = ()  # loaded, in _FILES' order
_caught = Caught()


def _new_loading_lock() -> None:
    # Another thread of the parent may have been loading (importing) a family at the fork.
    global _loading
    _loading = threading.RLock()


_fork.in_child(_new_loading_lock)


def families() -> tuple[Family, ...]:
    """The families loaded, after loading each whose package has been imported since."""
    for file in _FILES:
        # (None in sys.modules: a package blocked, as if not installed; not imported)
        if file.PACKAGE not in _tried and sys.modules.get(file.PACKAGE) is not None:
            _load(file)
    return _families


def caught() -> Caught:
    """The errors of every family loaded, read where they are caught (``except
    caught().connection:``): a family whose package was imported since is among them."""
    families()
    return _caught


def _load(file: _File) -> Family | None:
    """The family of ``file``, loaded now if it was not (redis-py first), or None if its
    package is not installed."""
    global _tried, _families, _caught
    with _loading:
        tried = dict(_tried)
        for each in (redis_py, file):
            if each.PACKAGE not in tried:
                try:
                    tried[each.PACKAGE] = each.load()
                except ImportError:
                    tried[each.PACKAGE] = None
                except Exception as exc:
                    if each is redis_py:  # redlease's own dependency: nothing works without
                        raise
                    # A version or fork it cannot serve: said once, and its clients are
                    # refused as unknown (raising here would replace the error being caught).
                    warn(
                        f"redlease cannot serve {each.PACKAGE} as installed: "
                        f"{type(exc).__name__}: {exc}"
                    )
                    tried[each.PACKAGE] = None
        loaded = tuple(
            family for family in (tried.get(f.PACKAGE) for f in _FILES) if family is not None
        )
        if loaded != _families:
            errors = [family.errors for family in loaded]
            _caught = Caught(
                base=_every([e.base for e in errors]),
                connection=_every([e.connection for e in errors]),
                timeout=_every([e.timeout for e in errors]),
                response=_every([e.response for e in errors]),
                noscript=_every([e.noscript for e in errors]),
                readonly=_every([e.readonly for e in errors]),
                loading=_every([e.loading for e in errors]),
                oom=_every([e.oom for e in errors]),
                denied=_every([kind for e in errors for kind in e.denied]),
                protocol=_every([kind for e in errors for kind in e.protocol]),
            )
            ConnectionFailed.__bases__ = _caught.connection or (_NoFamilyYet,)
            ReplyTimedOut.__bases__ = _caught.timeout or (_NoFamilyYet,)
            _families = loaded
        # last: a thread that finds the package tried finds its family and errors in place
        _tried = tried
        return tried[file.PACKAGE]


def _every(kinds: list[type[Exception] | None]) -> Classes:
    return tuple(dict.fromkeys(kind for kind in kinds if kind is not None))


def family_of(client: object) -> Family | None:
    """The family ``client`` belongs to, if redlease serves it: an instance of one of its
    client types (a subclass of the user's included), or of another type of its package
    (its Cluster clients, say)."""
    for family in families():
        if isinstance(client, (*family.clients, *family.async_clients)) or family.owns(client):
            return family
    return None


def from_url(url: str, **options: Any) -> Any:
    """A sync client for ``url``, of the family its scheme asks for (``valkey://`` and
    ``valkeys://``: valkey-py; ``redis://``, ``rediss://``, ``unix://``: redis-py).
    ValueError if no installed family takes the scheme."""
    scheme = url.partition("://")[0].lower()
    for file in _FILES:
        family = _load(file) if scheme in file.SCHEMES else None
        if family is not None:
            client_type: Any = family.clients[0]
            return client_type.from_url(url, **options)
    if scheme in ("valkey", "valkeys"):
        raise ValueError(f"a {scheme}:// URL needs valkey-py: pip install 'redlease[valkey]'")
    installed = [family for file in _FILES if file.SCHEMES and (family := _load(file))]
    known = ", ".join(f"{s}://" for f in installed for s in f.schemes)
    raise ValueError(f"unknown URL scheme {scheme!r} in {url!r} (known: {known})")


# Client libraries recognised by their package but not served (yet), and why: a lock
# built on one is refused at once, by name, rather than failing at its first command.
_GLIDE = (
    "valkey-glide clients are not served: a glide client exposes no connection settings, "
    "so redlease cannot open the connections its waiters block on, and a blocking wait "
    "on glide's one multiplexed connection would hold up the application's commands"
)
_UNSERVED = {"glide": _GLIDE, "glide_sync": _GLIDE}


def refusal(client: object) -> str | None:
    """Why ``client`` cannot be served, if it is of a library redlease knows it cannot
    serve; None for the families it serves and for clients it does not know."""
    family = family_of(client)
    if family is not None:
        reason = family.refusal(client)
    else:
        reason = _UNSERVED.get(type(client).__module__.partition(".")[0])
    if reason is None:
        return None
    return (
        f"{type(client).__module__}.{type(client).__qualname__}: {reason} (the clients "
        "served: docs/clients.md)"
    )
