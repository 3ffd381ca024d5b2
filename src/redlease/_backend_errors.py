"""What a server failure means for a lock, in words: one mapping for every driver."""

from __future__ import annotations

from . import _clients as c
from ._errors import BackendError
from ._resp import ReplyError

# What an error reply's code means for a lock.
_CODES = {
    "READONLY": "the server is a read-only replica; locks must be taken on a master",
    "OOM": "the server is out of memory (maxmemory reached) and refuses writes",
    "LOADING": "the server is still loading its data set",
    "NOPERM": "the server refused the command (authentication or ACL permissions)",
    "NOAUTH": "the server refused the command (authentication or ACL permissions)",
    "WRONGPASS": "the server refused the command (authentication or ACL permissions)",
    "MASTERDOWN": "the replica lost its master and refuses commands",
}


def describe(exc: BaseException) -> str:
    if isinstance(exc, ReplyError):
        return _CODES.get(exc.code, "the server returned an error")
    if isinstance(exc, c.READONLY_ERRORS):
        return "the server is a read-only replica; locks must be taken on a master"
    if isinstance(exc, c.OOM_ERRORS) or str(exc).startswith("OOM"):
        return "the server is out of memory (maxmemory reached) and refuses writes"
    if isinstance(exc, c.LOADING_ERRORS):
        return "the server is still loading its data set"
    if isinstance(exc, c.DENIED_ERRORS):
        return "the server refused the command (authentication or ACL permissions)"
    if isinstance(exc, (*c.TIMEOUT_ERRORS, TimeoutError)):
        return "the server did not answer in time"
    if isinstance(exc, (*c.CONNECTION_ERRORS, OSError)):
        return "the server cannot be reached"
    return "the server returned an error"


# Error replies that say "not now" rather than "never": loading its data after a restart,
# a replica that lost its master, a blocked command ended by a role change, a cluster
# resharding or without a majority.
_PASSING = ("LOADING", "MASTERDOWN", "UNBLOCKED", "TRYAGAIN", "CLUSTERDOWN")


def passing(error: BaseException) -> bool:
    """Whether a BackendError (or a failure) may pass by itself: the server was not
    reached, did not answer in time, or answered "not now". A wait with time left tries
    again after such a failure rather than giving up."""
    cause = error.__cause__ if isinstance(error, BackendError) else error
    if isinstance(cause, (*c.CONNECTION_ERRORS, *c.TIMEOUT_ERRORS, *c.LOADING_ERRORS, OSError)):
        return True
    return error_code(error) in _PASSING


def error_code(error: BaseException) -> str:
    """The first word of the server's error reply behind a failure ("WRONGTYPE",
    "NOSCRIPT"...); "" if the failure was not an error reply."""
    cause = error.__cause__ if isinstance(error, BackendError) else error
    if isinstance(cause, ReplyError):
        return cause.code
    if isinstance(cause, c.RESPONSE_ERRORS):
        return str(cause).split(" ", 1)[0]
    return ""


def backend_error(
    exc: BaseException, action: str, kind: type[BackendError] = BackendError
) -> BackendError:
    error = kind(f"{action} failed: {describe(exc)} ({type(exc).__name__}: {exc})")
    error.__cause__ = exc
    return error


# What a driver turns into BackendError; anything else (bugs, cancellation) passes through.
BACKEND_FAILURES: tuple[type[BaseException], ...] = (*c.BASE_ERRORS, OSError, ReplyError)
