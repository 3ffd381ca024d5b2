"""What the asyncio flavour does differently, in one place (twin of ``_sync.backend``).

The asyncio modules are the source of the blocking ones, which ``scripts/unasync.py``
generates from them by words alone (``async``/``await`` dropped, ``Async`` names without
it, this module's name made ``_sync.backend``). Whatever more differs between tasks and
threads lives here, under the same names in both backends: who holds (a task), how to
sleep, how a call through a client's own methods is bounded and gated, what a Cluster
client must do before its nodes are known, and what cancellation is and how a release
or clean-up is kept from being cut in half by it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import socket
import sys
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, ParamSpec, TypeVar

from .._base import fork as _fork
from .._base.misuse import AsyncOnly
from .._clients import ReplyTimedOut
from .._rules.decorate import refuse_undecorable
from .._wire import resp as _resp
from .._wire.endpoint import CLIENT_CALLS, Endpoint
from .._wire.endpoint import bounded as settings_within
from .._wire.resp import NOT_ENOUGH, fed, read_failed

if sys.version_info >= (3, 11, 3):  # earlier 3.11 releases mishandle nested cancellation
    from asyncio import timeout as _timeout  # type: ignore[attr-defined,unused-ignore]
else:  # a dependency of redis-py on these versions
    from async_timeout import timeout as _timeout

_deadline = _timeout  # ``async with _deadline(seconds)``: TimeoutError once they have passed

T = TypeVar("T")
P = ParamSpec("P")

ASYNC = True  # the flavour: what a client family is asked for

sleep = asyncio.sleep

current_holder = asyncio.current_task  # what a lease is acquired by (None outside a task)

Cancelled = asyncio.CancelledError

# What every object used in a block derives from: asyncio's says that ``async with`` is
# meant when ``with`` is tried (the blocking objects need nothing).
BlockBase = AsyncOnly


def going_away(exc: BaseException) -> bool:
    """Whether ``exc`` ends the process (Ctrl-C, exit, an error a signal handler raised:
    not an Exception, nor a task's cancellation): what it interrupted is cleaned up in
    haste."""
    return not isinstance(exc, (Exception, Cancelled))


async def settled(value: Any) -> Any:
    """``value``, awaited if it is awaitable: what an asyncio database driver's cursor
    returns may be either (psycopg's awaits, SQLAlchemy's result is already there)."""
    return await value if inspect.isawaitable(value) else value


def guarded(
    lock: AbstractAsyncContextManager[Any], fn: Callable[P, Awaitable[T]]
) -> Callable[P, Coroutine[Any, Any, T]]:
    """``@lock``: ``fn`` (an ``async def``) awaited under ``async with lock`` at each call;
    refused at once if its work would run after the lock is given back
    (``refuse_undecorable``). The lease is not passed: ``fn`` keeps its signature, and a
    caller that needs the lease (its fence) writes ``async with lock as lease``."""
    refuse_undecorable(lock, fn, want_async=True)

    @functools.wraps(fn)
    async def locked_call(*args: P.args, **kwargs: P.kwargs) -> T:
        async with lock:
            return await fn(*args, **kwargs)

    return locked_call


async def shielded(work: Callable[[bool], Awaitable[T]], hurried: bool = False) -> T:
    """Await ``work(hurried)`` to its end even if the caller is cancelled meanwhile (the
    cancellation is re-raised once it has finished): a release or a clean-up must never
    be cut in half, or a lock would stay behind that nobody knows about. ``hurried``: the
    process is going away (see ``_rules.flows.release``)."""
    task = asyncio.ensure_future(work(hurried))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await _to_the_end(task, work)
        raise


async def _to_the_end(task: asyncio.Future[T], work: Callable[[bool], Awaitable[T]]) -> None:
    """Wait for ``task`` to end, however often the caller is cancelled meanwhile. If the
    task itself was cancelled (by a sweep of every task, as asyncio.run's at its end,
    which found it already started), its work runs once more, in haste (the loop is
    closing), in a task made after the sweep: each clean-up is safe to run twice."""
    for again in (False, True):
        if again:
            if not task.cancelled():
                return
            task = asyncio.ensure_future(work(True))
        while not task.done():
            with contextlib.suppress(BaseException):
                await asyncio.shield(task)


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
            async with _deadline(timeout):
                await self._event.wait()


async def bounded(
    call: Callable[[], Awaitable[T]], timeout: float, late: list[Any] | None = None
) -> T:
    """``call()`` given up on (cancelled) after ``timeout``: ReplyTimedOut. (``late``
    serves the blocking twin, whose calls cannot be cancelled.)"""
    try:
        async with _deadline(timeout):
            return await call()
    except asyncio.TimeoutError:
        raise ReplyTimedOut(f"no reply within {timeout:.3f}s") from None


# Each client's call slots, per event loop: at most CLIENT_CALLS calls through it at once.
_SLOTS: weakref.WeakKeyDictionary[Any, dict[asyncio.AbstractEventLoop, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)
_fork.in_child(_SLOTS.clear)  # (the parent's loops are not the child's)


@contextlib.asynccontextmanager
async def client_slot(client: Any, timeout: float) -> AsyncIterator[None]:
    """A call through ``client``'s own methods, once one of its CLIENT_CALLS is free;
    ReplyTimedOut if none is within ``timeout`` (its calls hang: a node down)."""
    loop = asyncio.get_running_loop()
    loops = _SLOTS.get(client)
    if loops is None:
        loops = _SLOTS[client] = {}
    slots = loops.get(loop)
    if slots is None:
        slots = loops[loop] = asyncio.Semaphore(CLIENT_CALLS)
    try:
        await asyncio.wait_for(slots.acquire(), timeout)
    except asyncio.TimeoutError:
        msg = f"{CLIENT_CALLS} calls through the client under way for {timeout}s"
        raise ReplyTimedOut(msg) from None
    try:
        yield
    finally:
        slots.release()


async def meet_cluster(client: Any) -> None:
    """Let a Cluster client learn its nodes (an asyncio one does so at first use)."""
    await client.initialize()


# Connections (see ``_async.conn``) ----------------------------------------------------

TimedOut = asyncio.TimeoutError  # what a connect that took too long raises (3.10: not TimeoutError)

RECV_FLAGS = 0  # the socket is non-blocking already

# The event loop looks at I/O and timers only between turns, and a read answered by
# polling takes none: after this long without one, a read lets the loop take a turn.
_TURN_EVERY = 1e-3


def pool_owner() -> asyncio.AbstractEventLoop:
    """Whose pools a connection is taken from: the running loop's (each has its own)."""
    return asyncio.get_running_loop()


class Guard:
    """The state of a loop's pool or hub is only touched by its tasks: no lock."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class Freed:
    """The tasks waiting for a pool's connection, woken one per ``notify``, first come
    first woken (as a thread's ``threading.Condition``, the blocking twin's)."""

    def __init__(self, guard: Guard) -> None:
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def wait(self, timeout: float) -> bool:
        """Whether woken by a ``notify`` (False: ``timeout`` passed first)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with _deadline(timeout):
                await waiter
        except asyncio.TimeoutError:
            return waiter.done() and not waiter.cancelled()  # (woken as it timed out)
        finally:
            if not waiter.done():  # timed out, or cancelled: out of the line
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
        return True

    def notify(self) -> None:
        """Wake the first task still waiting, if any."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


async def connect(endpoint: Endpoint, bound: float) -> socket.socket:
    """A non-blocking socket connected to ``endpoint`` within ``bound`` (TimedOut, or the
    OSError of the last address tried)."""
    loop = asyncio.get_running_loop()
    async with _deadline(bound):
        if endpoint.path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, endpoint.path)
            except BaseException:
                sock.close()
                raise
            return sock
        infos = await loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
        error: OSError = OSError(f"no address for {endpoint.host}")
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            return sock
        raise error


def sender(sock: socket.socket) -> Callable[[bytes], Awaitable[None]]:
    """How ``data`` is written to ``sock``: at once if the kernel takes it all (a
    command mostly), else through the loop."""
    loop = asyncio.get_running_loop()

    async def send(data: bytes) -> None:
        try:
            sent = sock.send(data)
            if sent < len(data):
                await loop.sock_sendall(sock, memoryview(data)[sent:])
        except BlockingIOError:
            await loop.sock_sendall(sock, data)

    return send


def _cancel_due() -> bool:
    """The running task has been asked to cancel (a read must then wait, not poll or
    take what arrived, so that the cancellation lands there). Needs 3.11."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is not None and cancelling() > 0


async def poll(
    recv: Callable[[], int], buffer: bytearray, reader: Any, record: _resp.SpinRecord
) -> Any:
    """``_wire.resp.poll`` on a non-blocking socket, where a pending cancellation lands first:
    every _wire.resp.TURN of polling the event loop takes a turn, so other tasks wait on it no
    longer than that, and once more when polled replies came in a row for _TURN_EVERY."""
    if _cancel_due():
        await asyncio.sleep(0)
    if _resp.resting(record):
        return NOT_ENOUGH
    clock = time.perf_counter
    started = clock()
    turn = started + _resp.TURN
    reply = _resp.polled(recv, buffer, reader, record, started + _resp.BUDGET, turn)
    while reply is _resp.TURN_DUE:
        await asyncio.sleep(0)
        turn = record.turned = clock()
        turn += _resp.TURN
        reply = _resp.polled(recv, buffer, reader, record, started + _resp.BUDGET, turn)
    if reply is not NOT_ENOUGH and started - record.turned > _TURN_EVERY:
        record.turned = started
        await asyncio.sleep(0)
    return reply


# A timer per read (asyncio.timeout) costs a timer-heap push and leaves a cancelled
# handle behind, a few percent of a lock cycle. A connection's reads share one timer
# instead, armed when none is pending and moved only when it fires early: it fires about
# once per timeout, not once per read. It needs Task.cancelling()/uncancel() (3.11) to
# tell its own cancellation from the caller's, and the nested-cancellation fixes of
# 3.11.3; older versions bound each read with a timeout of its own.
_LAZY_DEADLINES = sys.version_info >= (3, 11, 3)


class SocketWait:
    """How a socket's reply is waited for once polling gave up: through the loop, bounded
    by a timer the connection's reads share (see _LAZY_DEADLINES)."""

    __slots__ = ("due", "expired", "handle", "loop", "sock", "task")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.task: asyncio.Task[Any] | None = None  # the task reading, while it reads
        self.due = 0.0
        self.expired = False
        self.handle: asyncio.TimerHandle | None = None

    async def read(
        self, buffer: bytearray, reader: Any, record: _resp.SpinRecord, timeout: float
    ) -> Any:
        """The next reply into ``reader``, within ``timeout`` (else ReplyTimedOut)."""
        if _cancel_due():
            await asyncio.sleep(0)  # it lands at this read, as the caller asked
        try:
            if not _LAZY_DEADLINES:
                return await bounded(lambda: self._more(buffer, reader), timeout)
            return await self._watched(buffer, reader, timeout)
        finally:
            record.turned = time.perf_counter()

    async def _watched(self, buffer: bytearray, reader: Any, timeout: float) -> Any:
        loop = self.loop
        task = asyncio.current_task()
        assert task is not None
        self.task, self.due, self.expired = task, loop.time() + timeout, False
        if self.handle is None or self.handle.when() > self.due:
            if self.handle is not None:
                self.handle.cancel()
            self.handle = loop.call_at(self.due, self._fire)
        cancelling = task.cancelling()  # type: ignore[attr-defined,unused-ignore]
        try:
            return await self._more(buffer, reader)
        except asyncio.CancelledError:
            if self.expired and task.uncancel() <= cancelling:  # type: ignore[attr-defined,unused-ignore]
                raise ReplyTimedOut(f"no reply within {timeout:.3f}s") from None
            raise  # the caller's own cancellation
        finally:
            self.task = None

    async def _more(self, buffer: bytearray, reader: Any) -> Any:
        """Wait for bytes (no bound here: the caller has it) until a reply is in."""
        while True:
            try:
                got = await self.loop.sock_recv_into(self.sock, buffer)
            except OSError as exc:
                raise read_failed(exc) from exc
            reply = fed(got, buffer, reader)
            if reply is not NOT_ENOUGH:
                return reply

    def _fire(self) -> None:
        self.handle = None
        if self.task is None:
            return  # no read in progress: the next one arms it again
        if self.loop.time() >= self.due:
            self.expired = True
            self.task.cancel()
        else:  # armed for an earlier read: move it to this one's deadline
            self.handle = self.loop.call_at(self.due, self._fire)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


_CLOSING: set[asyncio.Task[Any]] = set()  # class connections' disconnects under way


class ClassConnection:
    """A connection made with the client's own connection class (TLS, Sentinel...), used
    through its public methods only; every read bounded by us (its own ``timeout=``
    answers a timeout with None and keeps the late reply for the next command)."""

    lean = False
    stale = 0
    client_id: int | None = None
    __slots__ = ("__weakref__", "conn", "loop", "wire")  # (a pool counts it weakly)

    def __init__(self, conn: Any, pool: Any) -> None:
        self.conn = conn
        self.wire = pool.wire
        self.loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, endpoint: Endpoint, timeout: float, pool: Any) -> ClassConnection:
        conn = endpoint.connection_class(**settings_within(endpoint.class_settings, timeout))
        try:
            # the class's own connect (Sentinel discovery happens here), bounded as a whole
            await bounded(conn.connect, timeout)
        except BaseException:
            with contextlib.suppress(BaseException):
                await conn.disconnect(nowait=True)
            raise
        return cls(conn, pool)

    def alive(self) -> bool:
        return bool(self.conn.is_connected)

    async def send(self, data: bytes) -> None:
        await self.conn.send_packed_command([data], check_health=False)

    async def read(self, timeout: float, spin: bool = True) -> Any:
        return await bounded(self.conn.read_response, timeout)

    def drop_arrived(self) -> Exception | None:
        return None

    def close(self) -> None:
        # The class's disconnect is a coroutine: run it on its loop, without waiting
        # (from elsewhere, as a pool's finalizer, it goes with its transport).
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is self.loop:
            with contextlib.suppress(Exception):
                task = running.create_task(self.conn.disconnect(nowait=True))
                _CLOSING.add(task)  # (a loop holds its tasks weakly)
                task.add_done_callback(_CLOSING.discard)

    async def shut(self) -> None:
        """Close it, from the loop (as at its shutdown), and wait for that."""
        with contextlib.suppress(Exception):
            await self.conn.disconnect(nowait=True)


# The hub (see ``_async.conn``) -----------------------------------------------------------


def hub_locks() -> tuple[asyncio.Lock, Guard]:
    """A hub's two locks: one held across its I/O, and its state's guard (none: only the
    loop's tasks touch it)."""
    return asyncio.Lock(), Guard()


def start(
    reader: Callable[..., Coroutine[Any, Any, None]], *args: Any, name: str
) -> asyncio.Task[None]:
    """``reader(*args)`` running beside the caller: a task of the running loop (keep it:
    a loop holds its tasks weakly)."""
    return asyncio.get_running_loop().create_task(reader(*args), name=name)


def _set_if_pending(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


class RingQueue:
    """What a hub's reader puts (a ring, or None), taken by one waiting task at a time."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[Any] | None = None

    def put(self, item: Any) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(item)
        else:
            self._items.append(item)

    async def get(self, timeout: float) -> Any:
        """The next item, or None once ``timeout`` passed."""
        if self._items:
            return self._items.popleft()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        self._waiter = waiter
        # A timer, not asyncio.wait_for: before 3.12 that returns an item that came as
        # the caller was cancelled and drops the cancellation, so a task cancelled then
        # would go on waiting (an endless observer never ends).
        timer = loop.call_later(timeout, _set_if_pending, waiter, None)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiter = None
