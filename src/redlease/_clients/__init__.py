"""The client families redlease serves, one file each (``redis_py``, ``valkey_py``,
``coredis_py``), and what follows from all of them together: which family a client is
of, and the errors of every family, so that the drivers can catch and retry them without
knowing which.

A family is recognised by its documented client types and the package a client's type
comes from, never by looking at private parts of the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import coredis_py, redis_py, valkey_py
from .family import Errors, Family

if TYPE_CHECKING:
    import redis.exceptions

__all__ = [
    "FAMILIES",
    "ConnectionFailed",
    "Errors",
    "Family",
    "ReplyTimedOut",
    "family_of",
    "from_url",
    "refusal",
]

FAMILIES: tuple[Family, ...] = tuple(
    family
    for family in (redis_py.FAMILY, valkey_py.FAMILY, coredis_py.FAMILY)
    if family is not None
)


def family_of(client: object) -> Family | None:
    """The family ``client`` belongs to, if redlease serves it: an instance of one of its
    client types (a subclass of the user's included), or of another type of its package
    (its Cluster clients, say)."""
    for family in FAMILIES:
        if isinstance(client, (*family.clients, *family.async_clients)) or family.owns(client):
            return family
    return None


def from_url(url: str, **options: Any) -> Any:
    """A sync client for ``url``, of the family its scheme asks for (``valkey://`` and
    ``valkeys://``: valkey-py; ``redis://``, ``rediss://``, ``unix://``: redis-py).
    ValueError if no installed family takes the scheme."""
    scheme = url.partition("://")[0].lower()
    for family in FAMILIES:
        if scheme in family.schemes:
            client_type: Any = family.clients[0]
            return client_type.from_url(url, **options)
    if scheme in ("valkey", "valkeys"):
        raise ValueError(f"a {scheme}:// URL needs valkey-py: pip install 'redlease[valkey]'")
    known = ", ".join(f"{s}://" for f in FAMILIES for s in f.schemes)
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


def _every(kinds: list[type[Exception] | None]) -> tuple[type[Exception], ...]:
    return tuple(dict.fromkeys(kind for kind in kinds if kind is not None))


CONNECTION_ERRORS = _every([f.errors.connection for f in FAMILIES])
TIMEOUT_ERRORS = _every([f.errors.timeout for f in FAMILIES])
RESPONSE_ERRORS = _every([f.errors.response for f in FAMILIES])
NOSCRIPT_ERRORS = _every([f.errors.noscript for f in FAMILIES])
READONLY_ERRORS = _every([f.errors.readonly for f in FAMILIES])
LOADING_ERRORS = _every([f.errors.loading for f in FAMILIES])
OOM_ERRORS = _every([f.errors.oom for f in FAMILIES])
DENIED_ERRORS = _every([kind for f in FAMILIES for kind in f.errors.denied])
BASE_ERRORS = _every([f.errors.base for f in FAMILIES])

# What redlease's own connections raise: a connection error, or a timeout, in the terms
# of every family at once, so that whichever family's retry policy the client brought
# retries it, as it would its own (and its except clauses catch it).
if TYPE_CHECKING:

    class ConnectionFailed(redis.exceptions.ConnectionError): ...

    class ReplyTimedOut(redis.exceptions.TimeoutError): ...

else:
    ConnectionFailed = type("ConnectionFailed", CONNECTION_ERRORS, {"__module__": __name__})
    ReplyTimedOut = type("ReplyTimedOut", TIMEOUT_ERRORS, {"__module__": __name__})
