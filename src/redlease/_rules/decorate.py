"""``@lock``: a function run under a lock's `with` block at each call, and the refusal of
a function whose work would run after the lock is given back (a generator function; a
coroutine function under a blocking lock, or a plain one under an asyncio lock)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, ParamSpec, TypeVar

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


def decorate(lock: AbstractContextManager[Any], fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run under ``with lock`` at each call (refused at once if it cannot be,
    see ``refuse_undecorable``). The lease is not passed: ``fn`` keeps its signature,
    and a caller that needs the lease (its fence) writes ``with lock as lease``."""
    refuse_undecorable(lock, fn, want_async=False)

    @functools.wraps(fn)
    def locked_call(*args: P.args, **kwargs: P.kwargs) -> R:
        with lock:
            result = fn(*args, **kwargs)
            if inspect.iscoroutine(result):  # (a callable object whose __call__ is async)
                result.close()
                raise InvalidArgument(
                    f"{type(lock).__name__} cannot guard {fn!r}: it returned a coroutine, "
                    "whose work would run after the lock is given back"
                )
            return result

    return locked_call


def decorate_async(
    lock: AbstractAsyncContextManager[Any], fn: Callable[P, Awaitable[R]]
) -> Callable[P, Coroutine[Any, Any, R]]:
    """The asyncio twin of ``decorate``: ``fn`` (an ``async def``) awaited under
    ``async with lock`` at each call."""
    refuse_undecorable(lock, fn, want_async=True)

    @functools.wraps(fn)
    async def locked_call(*args: P.args, **kwargs: P.kwargs) -> R:
        async with lock:
            return await fn(*args, **kwargs)

    return locked_call
