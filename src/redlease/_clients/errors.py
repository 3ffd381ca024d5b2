"""A failure, as the clients and the wire raise it, sorted by what it means to a lock
(``traits_of``), whichever family raised it; and the server's error reply as redlease's
own readers return it (``ReplyError``). What a kind of failure means in words, and
whether it may pass, is the rules' (``_rules.classify``); the driver joins the two where
it builds the BackendError a caller sees (``_wire.errors``).

The classes come from ``caught()``: read where they are caught, so that every family
loaded by then is among them.
"""

from __future__ import annotations

from .._base.errors import Traits
from .._rules.classify import reply_code
from .registry import NotRedis, caught


class ReplyError(Exception):
    """An error reply from the server; ``code`` as ``reply_code`` reads it."""

    @property
    def code(self) -> str:
        return reply_code(str(self))


def traits_of(exc: BaseException) -> Traits:
    """What ``exc`` is to a lock, by its class (a family's, redlease's, Python's): one or
    more of "not_redis" (another service answered), "reply" (redlease's own ReplyError),
    "response" (a family's error reply), "readonly", "oom", "loading", "denied",
    "timeout" (no reply in time) and "connection" (the server not reached). A family's
    class may be two ("loading" and "connection"): the rules weigh them in their order."""
    errors = caught()
    checks: tuple[tuple[str, tuple[type[BaseException], ...]], ...] = (
        ("not_redis", (NotRedis, *errors.protocol)),
        ("reply", (ReplyError,)),
        ("response", errors.response),
        ("readonly", errors.readonly),
        ("oom", errors.oom),
        ("loading", errors.loading),
        ("denied", errors.denied),
        ("timeout", (*errors.timeout, TimeoutError)),
        ("connection", (*errors.connection, OSError)),
    )
    return frozenset(trait for trait, classes in checks if isinstance(exc, classes))


def code_of(exc: BaseException) -> str:
    """The code of the error reply ``exc`` carries ("" if it is not one)."""
    if isinstance(exc, ReplyError):
        return exc.code
    errors = caught()
    if isinstance(exc, errors.response):
        return reply_code(str(exc))
    return ""


def backend_failures() -> tuple[type[BaseException], ...]:
    """What a driver turns into BackendError; anything else (bugs, cancellation) passes
    through. Read where it is caught (``except backend_failures():``)."""
    return (*caught().base, OSError, ReplyError)


def reply_errors() -> tuple[type[Exception], ...]:
    """An error reply: ours (ReplyError) or one a family's connection or client raised.
    Read where it is caught (``except reply_errors():``)."""
    return (ReplyError, *caught().response)


def is_noscript(exc: BaseException) -> bool:
    """The server does not know the script (restarted, SCRIPT FLUSH, a promoted replica)."""
    return isinstance(exc, caught().noscript) or code_of(exc) == "NOSCRIPT"


def is_function_missing(exc: BaseException) -> bool:
    """The server has functions but not the one called (its library not loaded yet, or
    lost: a restart without data, FUNCTION FLUSH)."""
    return "Function not found" in str(exc)


def refuses_functions(exc: BaseException) -> bool:
    """The server has no functions (Redis 6.2: FCALL and FUNCTION are unknown commands),
    or the ACL user may not call them. (A user who may not load them may call a library
    another loaded.)"""
    text = str(exc).lower()
    if "@user_" in text:  # (a command a script called was refused: the script ran)
        return False
    return ("unknown command" in text and ("fcall" in text or "function" in text)) or (
        "no permissions" in text and "'fcall'" in text
    )


def refuses_eval(exc: BaseException) -> bool:
    """The ACL user may not run EVAL (one who calls functions need not)."""
    text = str(exc).lower()
    return "no permissions" in text and "'eval'" in text


def is_unblocked(exc: BaseException) -> bool:
    """A blocked command was ended by the server because it changed role (a failover)."""
    return code_of(exc) == "UNBLOCKED"
