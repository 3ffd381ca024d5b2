"""The fronts: what a caller of ``Lock``, ``AsyncLock``, ``Redlock`` and ``AsyncRedlock``
sees — ``acquire``, ``try_acquire``, ``with`` / ``async with`` — written once per twin.
A lock class supplies its driver (``_io``), the attempt it makes (``_new_attempt``) and
the lease it hands out (``_new_lease``); the front does the rest: checking the server
once, cleaning up after an interrupted attempt, starting renewal.

``with lock as lease`` remembers the lease it opened in a context variable (per thread,
per task), so nested and concurrent blocks each release their own.

A ``reentrant`` lock keeps a table of the leases it handed out by holder (the thread, or
the asyncio task, that acquired): an acquire by a holder returns its lease again, one
hold more (``hold_count``), and only the release of the last hold goes to the server.

A front is also a decorator (``decorate``, ``decorate_async``: ``@lock`` runs each call
under ``with lock``), and the asyncio front runs a coroutine under a lease that cancels
it if the lease is lost (``using``, after node-redlock's ``using(resources, duration,
routine(signal))``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from contextvars import ContextVar
from datetime import timedelta
from types import TracebackType
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from . import _arguments as args
from . import _metrics, _renewal
from ._clients import refusal
from ._errors import AcquireTimeout, InvalidArgument, LockError, LockLost
from ._flows import Grant
from ._lease import (
    AsyncDriver,
    AsyncLeaseBlock,
    Holders,
    LeaseState,
    SyncDriver,
    SyncLeaseBlock,
    _shielded,
)
from ._misuse import AsyncOnly

Seconds = float | timedelta


class Attempt(Protocol):
    """One caller's try to take a lock (``_flows.Acquisition``, ``_quorum``'s twin)."""

    @property
    def outstanding(self) -> bool:
        """Whether ``abandon()`` is needed if the attempt is interrupted."""

    def run(self) -> Generator[Any, Any, Grant | None]: ...

    def abandon(self) -> Generator[Any, Any, None]: ...


# Leases opened by `with lock` / `async with lock` in this context, innermost last, each
# with the hold count it had when the block took it, and the holder (thread, or task)
# that took it: a task started inside a block copies the context, not the holding.
_entered: ContextVar[tuple[tuple[object, Any, int, object], ...]] = ContextVar(
    "redlease_entered", default=()
)


def _push(lock: object, lease: Any, holder: object = None) -> None:
    """Note the lease (or a MultiLock's leases) a `with` block of ``lock`` took."""
    _entered.set((*_entered.get(), (lock, lease, lease._holds, holder)))


def _refuse_nested(lock: _Front, holder: object) -> None:
    """A `with` block of a lock that is not reentrant, inside a block of the same object
    whose lease ``holder`` still holds, would wait for that lease (until its ttl runs out,
    then take a lock its outer block believes it holds): refused at once, as
    python-redis-lock refuses a second acquire of one lock object."""
    for entered, lease, _, by in _entered.get():
        if entered is lock and by is holder and not (lease.released or lease.lost):
            raise LockError(
                f"{lock._noun} {lock.name!r} is held already by an enclosing `with` block "
                "of the same object in this thread (asyncio: task); a nested block would "
                "wait for it until its ttl ran out. Make the lock with reentrant=True to "
                "re-enter it, or release the outer lease first"
            )


def _pop(lock: object) -> Any:
    """The lease the innermost open block of ``lock`` took, to release as the block ends;
    None if its hold was released already inside the block (a reentrant lease: another
    release would take the hold of an outer block)."""
    stack = _entered.get()
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][0] is lock:
            _entered.set(stack[:i] + stack[i + 1 :])
            lease, depth = stack[i][1], stack[i][2]
            return lease if depth == 1 or lease._holds >= depth else None
    raise RuntimeError("exiting a lock's `with` block that did not enter it")


P = ParamSpec("P")
R = TypeVar("R")


def _named(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def _refuse_undecorable(lock: object, fn: object, *, want_async: bool) -> None:
    """A lock guards a call only if the function's work is done within the call (sync)
    or within awaiting it (asyncio): otherwise the work would run after the lock is
    given back, unguarded, and nothing would say so."""
    what = type(lock).__name__
    if not callable(fn):
        raise InvalidArgument(f"{what} decorates a function, not {type(fn).__name__}")
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise InvalidArgument(
            f"{what} cannot decorate the generator function {_named(fn)}: its body "
            "runs as it is iterated, after the call has returned; use `with` inside it"
        )
    if want_async and not inspect.iscoroutinefunction(fn):
        raise InvalidArgument(
            f"{what} decorates an `async def` function, not {_named(fn)}"
            "; decorate a plain function with the sync twin"
        )
    if not want_async and inspect.iscoroutinefunction(fn):
        raise InvalidArgument(
            f"{what} cannot decorate the coroutine function {_named(fn)}: its body "
            "runs when it is awaited, after the lock is given back; use the asyncio twin"
        )


def decorate(lock: AbstractContextManager[Any], fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run under ``with lock`` at each call (refused at once if it cannot be,
    see ``_refuse_undecorable``). The lease is not passed: ``fn`` keeps its signature,
    and a caller that needs the lease (its fence) writes ``with lock as lease``."""
    _refuse_undecorable(lock, fn, want_async=False)

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
    _refuse_undecorable(lock, fn, want_async=True)

    @functools.wraps(fn)
    async def locked_call(*args: P.args, **kwargs: P.kwargs) -> R:
        async with lock:
            return await fn(*args, **kwargs)

    return locked_call


async def _awaited(work: Awaitable[R]) -> R:
    return await work


async def _run_holding(lease: AsyncLeaseBlock, fn: Callable[..., Any], args: Any) -> Any:
    """``fn(lease, *args)`` in a task of its own, which the lease cancels if it is lost
    (as ``cancel_on_lost`` cancels the acquirer); its result, or its error. A task
    cancelled by the loss raises LockLost. Cancelling the caller cancels the task and
    waits for it to end, so nothing runs on unguarded once the lease is released."""
    work = fn(lease, *args)
    if not inspect.isawaitable(work):
        raise InvalidArgument(
            f"using() runs an async callable; {_named(fn)} returned "
            f"{type(work).__name__}, not an awaitable"
        )
    task = asyncio.get_running_loop().create_task(_awaited(work))
    previous, lease._holder = lease._holder, task
    try:
        if lease.lost:  # lost before the task could be told: it never starts
            task.cancel()
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):  # cancelled again: go on
                await asyncio.wait({task})
            raise
    finally:
        lease._holder = previous
    if task.cancelled() and lease.lost:
        try:
            task.result()
        except asyncio.CancelledError as cancelled:
            raise LockLost(
                f"lease on {lease.name!r} was lost ({lease._lost_reason}): the work "
                "under it was cancelled"
            ) from cancelled
    return task.result()


SyncLeaseT = TypeVar("SyncLeaseT", bound=SyncLeaseBlock)
AsyncLeaseT = TypeVar("AsyncLeaseT", bound=AsyncLeaseBlock)


class _Front:
    """What both fronts need from the lock class they serve."""

    _auto_renew: bool
    _max_hold: float | None
    _holding: Holders | None = None  # reentrant: each holder's lease
    _refuses_nesting = False  # a nested `with` by its holder is refused (a Lock's)
    _noun = "lock"  # what errors call it
    # What its metrics call it (``redlease.kind``, ``redlease.mode``), and the attribute
    # sets made for them (see ``_metrics.Labels``).
    _metric_kind = "lock"
    _metric_mode: str | None = None
    _labels: _metrics.Labels | None = None

    @property
    def name(self) -> str:  # the lock's own config class says
        raise NotImplementedError

    def _held_by(self, holder: object) -> LeaseState | None:
        """The lease ``holder`` holds already (a reentrant lock's), with one hold more.
        A lease found lost is dropped from the table and reported: the work it
        protects is no longer protected, and a new lease would hide that."""
        holding = self._holding
        lease = None if holding is None else holding.held(holder)
        if lease is None:
            return None
        assert holding is not None
        if lease.lost:
            holding.left(holder, lease)
            raise LockLost(
                f"lease on {self.name!r} that this holder acquired before was lost: "
                f"{lease._lost_reason}"
            )
        lease._holds += 1
        return lease

    def _hold(self, holder: object, lease: LeaseState) -> None:
        if self._holding is not None:
            self._holding.hold(holder, lease)

    def _new_attempt(self, timeout: float | None, *, wait: bool) -> Attempt:
        raise NotImplementedError

    def _metered(self) -> _metrics.Labels | None:
        of = _metrics.instruments()
        if of is None:
            return None
        labels = self._labels
        if labels is None or labels.of is not of:  # first use, or configured anew
            labels = self._labels = of.labels(self._metric_kind, self._metric_mode, self.name)
        return labels

    def _opened(self, lease: LeaseState, started: float) -> None:
        """A lease handed out by an acquire that started at ``started``: granted by the
        server, or one name's of a multi-lock's single script (each counts as an
        acquisition)."""
        labels = self._metered()
        if labels is not None:
            lease._labels = labels
            lease._since = labels.granted(started)

    def _not_granted(self, started: float, *, wait: bool) -> None:
        labels = self._metered()
        if labels is not None:
            labels.not_granted(started, waited=wait)


class SyncFront(_Front, Generic[SyncLeaseT]):
    """``acquire``, ``try_acquire`` and ``with``, once for ``Lock`` and ``Redlock``."""

    _io: SyncDriver

    def _new_lease(self, grant: Grant) -> SyncLeaseT:
        raise NotImplementedError

    def acquire(self, timeout: Seconds | None = None) -> SyncLeaseT:
        """Wait until the lock is ours and return the lease.

        ``timeout`` bounds the wait in seconds (None: no bound; 0: a single try).
        Raises AcquireTimeout if the lock stayed busy (a Redlock: QuorumError if too few
        nodes answered); BackendError if the server failed until the timeout;
        InvalidArgument for a bad ``timeout``; LockLost if a ``reentrant`` holder's lease
        was lost meanwhile.
        """
        lease = self._acquire(args.timeout(timeout), wait=True)
        if lease is None:
            raise AcquireTimeout(f"{self._noun} {self.name!r} still busy after {timeout}s")
        return lease

    def try_acquire(self) -> SyncLeaseT | None:
        """Take the lock if it is free right now; never waits. None if it is busy.

        Raises BackendError if the server fails (a Redlock: QuorumError if too few nodes
        answered), and LockLost if a ``reentrant`` holder's lease was lost meanwhile.
        Against a server that is down or does not answer it raises within 2 seconds,
        whatever the ttl and the client's retry policy (a connection failure is tried
        again once, at once); with ``replicas=``, add the wait for them. A Cluster
        client's calls keep its own timeouts and retries.
        """
        return self._acquire(0.0, wait=False)

    def _acquire(self, timeout: float | None, *, wait: bool) -> SyncLeaseT | None:
        if self._holding is None:
            return self._take(timeout, wait=wait)
        holder = threading.current_thread()
        held = self._held_by(holder)
        if held is not None:
            return held  # type: ignore[return-value]
        lease = self._take(timeout, wait=wait)
        if lease is not None:
            self._hold(holder, lease)
        return lease

    def _take(self, timeout: float | None, *, wait: bool) -> SyncLeaseT | None:
        started = _metrics.now()
        self._io.check_server_once()
        attempt = self._new_attempt(timeout, wait=wait)
        try:
            grant = self._io.run(attempt.run(), f"acquire {self.name!r}")
        except BaseException:
            if attempt.outstanding:
                # The original error matters more; an orphaned key expires with its ttl.
                with contextlib.suppress(Exception):
                    self._io.run(attempt.abandon(), f"clean up {self.name!r}")
            raise
        if grant is None:
            self._not_granted(started, wait=wait)
            return None
        return self._watched(grant, started)

    def _watched(self, grant: Grant, started: float) -> SyncLeaseT:
        lease = self._new_lease(grant)
        self._opened(lease, started)
        if self._auto_renew:
            _renewal.watch(lease, self._io, self._max_hold)
        return lease

    def __enter__(self) -> SyncLeaseT:
        holder = threading.current_thread()
        if self._refuses_nesting and self._holding is None:
            _refuse_nested(self, holder)
        lease = self.acquire()
        _push(self, lease, holder)
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = _pop(self)
        if lease is not None:
            assert isinstance(lease, SyncLeaseBlock)
            lease.__exit__(exc_type, exc, tb)

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """``@lock``: each call of ``fn`` runs under ``with lock``, and raises what that
        raises. A coroutine or generator function is refused (InvalidArgument)."""
        return decorate(self, fn)


class AsyncFront(_Front, AsyncOnly, Generic[AsyncLeaseT]):
    """The asyncio twin of ``SyncFront``, once for ``AsyncLock`` and ``AsyncRedlock``;
    also ``cancel_on_lost``."""

    _io: AsyncDriver
    _cancel_on_lost: bool

    def _new_lease(self, grant: Grant) -> AsyncLeaseT:
        raise NotImplementedError

    async def acquire(self, timeout: Seconds | None = None) -> AsyncLeaseT:
        """Wait until the lock is ours and return the lease.

        ``timeout`` bounds the wait in seconds (None: no bound; 0: a single try).
        Raises AcquireTimeout if the lock stayed busy (a Redlock: QuorumError if too few
        nodes answered); BackendError if the server failed until the timeout;
        InvalidArgument for a bad ``timeout``; LockLost if a ``reentrant`` holder's lease
        was lost meanwhile. Cancelling the caller at any point leaves no lock behind: a
        lock granted meanwhile is released.
        """
        lease = await self._acquire(args.timeout(timeout), wait=True)
        if lease is None:
            raise AcquireTimeout(f"{self._noun} {self.name!r} still busy after {timeout}s")
        return lease

    async def try_acquire(self) -> AsyncLeaseT | None:
        """Take the lock if it is free right now; never waits. None if it is busy.

        Raises as the sync ``try_acquire`` does, within the same bound.
        """
        return await self._acquire(0.0, wait=False)

    async def _acquire(self, timeout: float | None, *, wait: bool) -> AsyncLeaseT | None:
        if self._holding is None:
            return await self._take(timeout, wait=wait)
        holder = asyncio.current_task()
        held = self._held_by(holder)
        if held is not None:
            return held  # type: ignore[return-value]
        lease = await self._take(timeout, wait=wait)
        if lease is not None:
            self._hold(holder, lease)
        return lease

    async def _take(self, timeout: float | None, *, wait: bool) -> AsyncLeaseT | None:
        started = _metrics.now()
        await self._io.check_server_once()
        attempt = self._new_attempt(timeout, wait=wait)
        try:
            grant = await self._io.run(attempt.run(), f"acquire {self.name!r}")
        except BaseException:
            if attempt.outstanding:
                await self._abandon(attempt)
            raise
        if grant is None:
            self._not_granted(started, wait=wait)
            return None
        return self._watched(grant, started)

    def _watched(self, grant: Grant, started: float) -> AsyncLeaseT:
        lease = self._new_lease(grant)
        self._opened(lease, started)
        if self._cancel_on_lost:
            lease._holder = asyncio.current_task()
        if self._auto_renew:
            _renewal.watch_async(lease, self._io, self._max_hold)
        elif self._cancel_on_lost:
            _renewal.watch_async(lease, self._io, 0.0)  # watch its validity, never renew
        return lease

    async def _abandon(self, attempt: Attempt) -> None:
        try:
            await _shielded(self._io.run(attempt.abandon(), f"clean up {self.name!r}"))
        except Exception:
            pass  # the original error matters more; an orphaned key expires with its ttl
        except asyncio.CancelledError:
            pass  # cancelled again while cleaning up; the clean-up itself ran to its end

    async def __aenter__(self) -> AsyncLeaseT:
        holder = asyncio.current_task()
        if self._refuses_nesting and self._holding is None:
            _refuse_nested(self, holder)
        lease = await self.acquire()
        _push(self, lease, holder)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = _pop(self)
        if lease is not None:
            assert isinstance(lease, AsyncLeaseBlock)
            await lease.__aexit__(exc_type, exc, tb)

    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        """``@alock``: each call of the ``async def`` ``fn`` is awaited under ``async
        with alock``, and raises what that raises. Anything else is refused
        (InvalidArgument)."""
        return decorate_async(self, fn)

    async def using(
        self,
        fn: Callable[..., Awaitable[R]],
        /,
        *args: Any,
        timeout: Seconds | None = None,
    ) -> R:
        """Acquire (waiting up to ``timeout``, as ``acquire``), run ``await fn(lease,
        *args)`` in a task of its own while the lease is renewed, release, and return
        its result.

        The lease is renewed for as long as ``fn`` runs, whatever ``auto_renew`` says
        (``max_hold`` still ends it). If it is lost (taken over, not renewed in time,
        ``max_hold`` reached) the task is cancelled, as ``cancel_on_lost`` would, and
        ``using`` raises ``LockLost`` (its cause: the cancellation), not CancelledError.
        An error raised by ``fn`` propagates after the release (LockLost included: a
        lease ``fn`` found lost itself). If ``fn`` returns but the lease was lost
        meanwhile, the release raises ``LockLost``, as at the end of ``async with``.
        Cancelling the caller cancels the task, waits for it to end, releases, and
        re-raises. Keyword arguments for ``fn``: ``functools.partial``.
        """
        if not callable(fn):
            raise InvalidArgument(f"fn must be an async callable, not {type(fn).__name__}")
        lease = await self.acquire(timeout)
        if not self._auto_renew and lease.hold_count == 1:
            # a lease that is not renewed, or only watched for cancel_on_lost: renewed now
            lease._stop_watching()
            _renewal.watch_async(lease, self._io, self._max_hold)
        try:
            result = await _run_holding(lease, fn, args)
        except LockLost:
            if not lease.lost:  # fn's own error, as any other
                raise
            with contextlib.suppress(LockLost):  # what the server still has goes
                await lease.release()
            raise
        except BaseException as exc:
            await lease.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        await lease.__aexit__(None, None, None)
        return result  # type: ignore[no-any-return]


def is_async_client(client: object) -> bool:
    return inspect.iscoroutinefunction(getattr(client, "execute_command", None))


def check_served(client: object, what: str) -> None:
    """Refuse what redlease cannot serve, naming the argument (``what``) and the client."""
    refused = refusal(client)
    if refused is not None:
        raise InvalidArgument(f"{what} is refused: {refused}")
    if isinstance(client, type):
        raise InvalidArgument(f"{what} must be a client, not the class {client.__name__}")
    if callable(getattr(client, "master_for", None)):
        raise InvalidArgument(
            f"{what} is a Sentinel manager: pass the master's client, "
            f"sentinel.master_for(service_name)"
        )
    if not callable(getattr(client, "execute_command", None)):
        raise InvalidArgument(
            f"{what} must be a redis-py or valkey-py client, not {type(client).__name__}"
        )


def check_client(client: object, *, want_async: bool, sync_twin: str = "Lock") -> None:
    check_served(client, "client")
    if is_async_client(client) != want_async:
        if want_async:
            raise InvalidArgument(
                "client must be an asyncio client (redis.asyncio, valkey.asyncio) for "
                f"Async{sync_twin}; use {sync_twin} with a sync client"
            )
        raise InvalidArgument(
            f"client must be a sync client (redis.Redis, valkey.Valkey) for {sync_twin}; "
            f"use Async{sync_twin} with an asyncio client"
        )
