"""``@lock``: the refusal of a function whose work would run after the lock is given back
(a generator function; a coroutine function under a blocking lock, or a plain one under an
asyncio lock). The wrappers that run a call under the lock are each backend's
``guarded``."""

from __future__ import annotations

import inspect
from typing import ParamSpec, TypeVar

from .._base.errors import InvalidArgument

P = ParamSpec("P")
R = TypeVar("R")


def named(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def refuse_undecorable(lock: object, fn: object, *, want_async: bool) -> None:
    """A lock guards a call only if the function's work is done within the call (sync)
    or within awaiting it (asyncio): otherwise the work would run after the lock is
    given back, unguarded, and nothing would say so."""
    what = type(lock).__name__
    if not callable(fn):
        raise InvalidArgument(f"{what} decorates a function, not {type(fn).__name__}")
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise InvalidArgument(
            f"{what} cannot decorate the generator function {named(fn)}: its body "
            "runs as it is iterated, after the call has returned; use `with` inside it"
        )
    if want_async and not inspect.iscoroutinefunction(fn):
        raise InvalidArgument(
            f"{what} decorates an `async def` function, not {named(fn)}"
            "; decorate a plain function with the sync twin"
        )
    if not want_async and inspect.iscoroutinefunction(fn):
        raise InvalidArgument(
            f"{what} cannot decorate the coroutine function {named(fn)}: its body "
            "runs when it is awaited, after the lock is given back; use the asyncio twin"
        )
