"""A failure as the BackendError a caller sees: what the clients say it is
(``_clients.errors``), weighed by the rules (``_rules.classify``), in one place."""

from __future__ import annotations

from .._base.errors import BackendError
from .._clients.errors import code_of, traits_of
from .._rules.classify import meaning, plain, transient


def backend_error(
    exc: BaseException, action: str, kind: type[BackendError] = BackendError, server: str = ""
) -> BackendError:
    """``exc`` as the error of ``action``, said in a lock's terms; ``server``: the one
    that failed, named in the message. What the rules read of it (its reason, its
    reply's code, whether it may pass) is set on it here."""
    traits, code, text = traits_of(exc), code_of(exc), str(exc)
    reason = meaning(traits, code, text)
    where = f" on {server}" if server else ""
    error = kind(f"{action} failed{where}: {reason} ({type(exc).__name__}: {plain(text)})")
    error.reason, error.code = reason, code
    error.transient = transient(traits, code, text)
    error.__cause__ = exc
    return error
