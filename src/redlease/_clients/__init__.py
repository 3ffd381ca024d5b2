"""The client families redlease serves, one file each (``redis_py``, ``valkey_py``,
``coredis_py``), and what follows from all of them together: which family a client is
of, and the errors of every family, so that the drivers can catch and retry them without
knowing which.

A family is recognised by its documented client types and the package a client's type
comes from, never by looking at private parts of the client.

A family's package is imported when it is first needed, not with redlease (coredis alone
would add most of a second to every ``redlease`` command's start). Whatever asks about
families or catches their errors (``family_of``, ``caught()``) first loads each family
whose package has been imported since, by the application or by redlease
(``from_url``): a client or an error of a family cannot reach redlease before its
package was imported, so redlease never looks at one before its family is loaded.
redis-py, redlease's own dependency, is always loaded first, as it was when every family
was imported with redlease: ``ConnectionFailed`` and ``ReplyTimedOut`` keep the same
bases, in the same order.
"""

from __future__ import annotations

from .family import Errors, Family
from .registry import (
    Caught,
    ConnectionFailed,
    NotRedis,
    ReplyTimedOut,
    caught,
    families,
    family_of,
    from_url,
    refusal,
)

__all__ = [
    "Caught",
    "ConnectionFailed",
    "Errors",
    "Family",
    "NotRedis",
    "ReplyTimedOut",
    "caught",
    "families",
    "family_of",
    "from_url",
    "refusal",
]
