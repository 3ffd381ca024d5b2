"""What the asyncio flavour does differently, in one place (twin of ``_backend_sync``).

The asyncio modules are the source of the blocking ones, which ``scripts/unasync.py``
generates from them by words alone (``async``/``await`` dropped, ``_async`` names made
``_sync``). Whatever more differs between tasks and threads lives here, under the same
names in both backends: who holds (a task), how to sleep, how a call through a client's own
methods is bounded and gated, what a Cluster client must do before its nodes are known, and
what cancellation is and how a release or clean-up is kept from being cut in half by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from . import _fork
from ._endpoint import CLIENT_CALLS, ReplyTimedOut

if sys.version_info >= (3, 11, 3):  # earlier 3.11 releases mishandle nested cancellation
    from asyncio import timeout as _timeout  # type: ignore[attr-defined,unused-ignore]
else:  # a dependency of redis-py on these versions
    from async_timeout import timeout as _timeout

deadline = _timeout  # ``async with deadline(seconds)``: TimeoutError once they have passed

T = TypeVar("T")

ASYNC = True  # the flavour: what a client family is asked for

sleep = asyncio.sleep

current_holder = asyncio.current_task  # what a lease is acquired by (None outside a task)

Cancelled = asyncio.CancelledError


async def shielded(work: Callable[[], Awaitable[T]]) -> T:
    """Await ``work()`` to its end even if the caller is cancelled meanwhile (the
    cancellation is re-raised once it has finished): a release or a clean-up must never be
    cut in half, or a lock would stay behind that nobody knows about."""
    task = asyncio.ensure_future(work())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            with contextlib.suppress(BaseException):
                await task  # cancelled again: finish anyway, then propagate
        raise


class Flag:
    """Set once (in its loop, or from any thread); waited for with a bound, in a task."""

    def __init__(self) -> None:
        self._set = False
        self._event: asyncio.Event | None = None  # made by the first wait, in its loop
        self._loop: asyncio.AbstractEventLoop | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        event, loop = self._event, self._loop
        if event is None or loop is None:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                loop.call_soon_threadsafe(event.set)

    async def wait(self, timeout: float) -> None:
        """Return once set, or after ``timeout`` seconds."""
        if self._event is None:
            self._event, self._loop = asyncio.Event(), asyncio.get_running_loop()
        if self._set:  # (set before the event was there to wake)
            return
        with contextlib.suppress(asyncio.TimeoutError):  # (not TimeoutError before 3.11)
            async with deadline(timeout):
                await self._event.wait()


async def bounded(
    call: Callable[[], Awaitable[T]], timeout: float, late: list[Any] | None = None
) -> T:
    """``call()`` given up on (cancelled) after ``timeout``: ReplyTimedOut. (``late``
    serves the blocking twin, whose calls cannot be cancelled.)"""
    try:
        async with deadline(timeout):
            return await call()
    except asyncio.TimeoutError:
        raise ReplyTimedOut(f"no reply within {timeout:.3f}s") from None


# Each client's gate, per event loop: at most CLIENT_CALLS calls through it at once.
_GATES: weakref.WeakKeyDictionary[Any, dict[asyncio.AbstractEventLoop, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)
_fork.in_child(_GATES.clear)  # (the parent's loops are not the child's)


@contextlib.asynccontextmanager
async def gate(client: Any, timeout: float) -> AsyncIterator[None]:
    """A call through ``client``'s own methods, once one of its CLIENT_CALLS is free;
    ReplyTimedOut if none is within ``timeout`` (its calls hang: a node down)."""
    loop = asyncio.get_running_loop()
    gates = _GATES.get(client)
    if gates is None:
        gates = _GATES[client] = {}
    gate = gates.get(loop)
    if gate is None:
        gate = gates[loop] = asyncio.Semaphore(CLIENT_CALLS)
    try:
        await asyncio.wait_for(gate.acquire(), timeout)
    except asyncio.TimeoutError:
        msg = f"{CLIENT_CALLS} calls through the client under way for {timeout}s"
        raise ReplyTimedOut(msg) from None
    try:
        yield
    finally:
        gate.release()


async def meet_cluster(client: Any) -> None:
    """Let a Cluster client learn its nodes (an asyncio one does so at first use)."""
    await client.initialize()
