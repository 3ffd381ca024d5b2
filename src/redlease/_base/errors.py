"""The error tree. Every error redlease raises on purpose derives from LockError::

    LockError
    ├── AcquireTimeout      (also TimeoutError) the lock stayed busy until the deadline
    ├── LockLost            the lease is no longer ours (expired, taken over, released)
    │   └── StaleFence      a fence gate refused its fence: a newer holder has written
    ├── QuorumError         Redlock could not reach a majority; .failures says why per node
    ├── BackendError        the server failed; the redis-py exception is kept as __cause__
    └── InvalidArgument     (also ValueError and TypeError) a bad argument, named in the message

Contention in ``try_acquire`` is not an error: it returns ``None``.
"""

from __future__ import annotations

import inspect
import os
import threading
import warnings
from collections.abc import Mapping

# What a failure is, as the clients sort it (``_clients.errors.traits_of``) and the rules
# weigh it (``_rules.classify``): "timeout", "connection", "denied"...
Traits = frozenset[str]


class LockError(Exception):
    """Root of every error redlease raises."""


class AcquireTimeout(LockError, TimeoutError):
    """The lock was still held by someone else when the caller's timeout ran out."""


class LockLost(LockError):
    """The lease is not (or no longer) ours: it expired, was taken over, or was released."""


class StaleFence(LockLost):
    """A fence gate refused a fence: a greater one has passed for the same resource, so
    the lease that brought it was lost and a newer holder has written since. Nothing
    was written through the gate; roll the transaction back and do not retry with this
    fence. ``resource``, ``fence`` and ``recorded`` (the greatest passed, None if it is
    not known) say which."""

    def __init__(self, resource: str, fence: int, recorded: int | None) -> None:
        newer = "a greater fence" if recorded is None else f"fence {recorded}"
        super().__init__(
            f"fence {fence} for {resource!r} is stale: {newer} has passed the gate, so the "
            "lease it came with was lost and a newer holder has written since"
        )
        self.resource, self.fence, self.recorded = resource, fence, recorded

    def __reduce__(self) -> tuple[object, ...]:  # (its arguments are not its message)
        return (type(self), (self.resource, self.fence, self.recorded))


class BackendError(LockError):
    """The server could not do what was asked; the original exception is ``__cause__``.

    Raised only when the outcome is known to be "not held" by this caller: if a lock
    may have been taken, redlease releases it before raising. Its message says what the
    failure means (out of reach, no answer in time, a refusal and of what, a server that
    does not speak Redis) and names the server.

    ``reason`` is what the failure means, in those words; ``code`` the first word of the
    server's error reply behind it ("WRONGTYPE", "NOPERM"...; "" if the server did not
    answer with one); ``transient`` whether it may pass by itself (the server was not
    reached or did not answer in time, or said "not now": loading, failing over): a
    retry may then succeed, where a refusal stays.
    """

    reason: str = ""
    code: str = ""
    transient: bool = False


class QuorumError(BackendError):
    """Redlock could not reach a majority of its nodes.

    ``failures`` maps each failed node (its description) to what went wrong there.
    """

    def __init__(self, message: str, failures: Mapping[str, str]) -> None:
        details = "; ".join(f"{node}: {why}" for node, why in failures.items())
        super().__init__(f"{message} ({details})" if details else message)
        self.failures = dict(failures)


class InvalidArgument(LockError, ValueError, TypeError):
    """An argument has a wrong type or value; the message names the argument.

    It is both a ValueError and a TypeError so that callers may catch whichever
    they think of first.
    """


class RedleaseWarning(UserWarning):
    """A configuration that weakens the guarantees (for example a key-evicting server)."""


_HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the package
# They are redlease.X wherever they are raised (tracebacks, pickles, logs), also where no
# public name of the package has been touched yet (it loads them on first use).
for _error in (
    LockError,
    AcquireTimeout,
    LockLost,
    StaleFence,
    BackendError,
    QuorumError,
    InvalidArgument,
    RedleaseWarning,
):
    _error.__module__ = "redlease"
del _error

_SAID: set[str] = set()  # what warn(once=...) has said in this process
_SAYING = threading.Lock()


def warn(message: str, *, once: str | None = None) -> None:
    """A RedleaseWarning that points at the caller's own line (the first one outside
    redlease, as deep as it is); with ``once`` (say, a server and what is said of it),
    given at most once per process for that key."""
    if once is not None:
        with _SAYING:
            if once in _SAID:
                return
            _SAID.add(once)
    level = 1
    frame = inspect.currentframe()
    while frame is not None and frame.f_code.co_filename.startswith(_HOME):
        frame = frame.f_back
        level += 1
    del frame
    warnings.warn(message, RedleaseWarning, stacklevel=level)
