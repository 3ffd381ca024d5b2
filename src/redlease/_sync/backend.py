"""What the blocking flavour does differently, in one place (twin of ``_async.backend``,
whose docstring says what belongs here)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import queue
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, ParamSpec, TypeVar

from .._base import fork as _fork
from .._base import threads as _threads
from .._base.errors import InvalidArgument
from .._base.timing import SHORTEST_WAIT
from .._clients import ReplyTimedOut
from .._rules.decorate import refuse_undecorable
from .._wire import resp as _resp
from .._wire.endpoint import CLIENT_CALLS, Endpoint
from .._wire.endpoint import bounded as settings_within
from .._wire.resp import NOT_ENOUGH, fed, read_failed

T = TypeVar("T")
P = ParamSpec("P")

ASYNC = False  # the flavour: what a client family is asked for

sleep = time.sleep

current_holder = threading.current_thread  # what a lease is acquired by

BlockBase = object  # (asyncio's objects say that ``async with`` is meant: see its twin)


class Cancelled(BaseException):
    """Never raised: a blocking call is not cancelled (a thread cannot be)."""


def going_away(exc: BaseException) -> bool:
    """Whether ``exc`` ends the process (Ctrl-C, exit, an error a signal handler raised:
    not an Exception): what it interrupted is cleaned up in haste."""
    return not isinstance(exc, Exception)


def settled(value: T) -> T:
    """``value``: a blocking driver's result is already there."""
    return value


def guarded(lock: AbstractContextManager[Any], fn: Callable[P, T]) -> Callable[P, T]:
    """``@lock``: ``fn`` run under ``with lock`` at each call; refused at once if its work
    would run after the lock is given back (``refuse_undecorable``), or when a call returns
    a coroutine (a callable object whose ``__call__`` is async), which is closed unrun."""
    refuse_undecorable(lock, fn, want_async=False)

    @functools.wraps(fn)
    def locked_call(*args: P.args, **kwargs: P.kwargs) -> T:
        with lock:
            result = fn(*args, **kwargs)
            if inspect.iscoroutine(result):
                result.close()
                raise InvalidArgument(
                    f"{type(lock).__name__} cannot guard {fn!r}: it returned a coroutine, "
                    "whose work would run after the lock is given back"
                )
            return result

    return locked_call


def shielded(work: Callable[[bool], T], hurried: bool = False) -> T:
    """``work(hurried)``, a clean-up (each is safe to run twice). A blocking call cannot
    be cut in half by a cancellation, but an error raised by a signal handler (a second
    Ctrl-C, as the first one's clean-up is on its way) can: the clean-up then runs once
    more, in haste (``work(True)``: see ``_rules.flows.release``), and the interruption
    goes on; a third may cut it short."""
    try:
        return work(hurried)
    except Exception:
        raise
    except BaseException:
        with contextlib.suppress(Exception):
            work(True)
        raise


class Flag:
    """Set once, from any thread; waited for with a bound."""

    def __init__(self) -> None:
        self._event = threading.Event()
        _fork.renew_in_child(self._after_fork)

    def _after_fork(self) -> None:
        # The event's lock may have been held by a thread of the parent (setting it, or
        # starting a wait) at the fork; whether it was set carries over.
        was_set, self._event = self._event.is_set(), threading.Event()
        if was_set:
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout: float) -> None:
        """Return once set, or after ``timeout`` seconds."""
        self._event.wait(timeout)


def bounded(call: Callable[[], T], timeout: float, late: list[Any] | None = None) -> T:
    """``call()`` (a client's own method, with no bound of ours) given up on after
    ``timeout``: it runs on in a daemon thread of its own, its outcome unseen, as a reply
    that comes too late is on a connection of ours. ``late`` keeps such a call of the same
    client while it runs: until it returns, the client counts as not answering, so a hung
    server costs one thread, not one per round."""
    if late is None:
        late = []
    if late:
        if late[0].is_alive():
            raise ReplyTimedOut("its previous call, given up on, has not returned yet")
        late.clear()
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the caller below
            outcome.append((False, exc))

    thread = _threads.daemon(run, name="redlease-bounded-call")
    thread.join(timeout)
    if not outcome:
        late.append(thread)
        raise ReplyTimedOut(f"no reply within {timeout:.3f}s")
    done, value = outcome[0]
    if done:
        return value  # type: ignore[no-any-return]
    raise value


# Each client's call slots: at most CLIENT_CALLS calls through it at once.
_SLOTS: weakref.WeakKeyDictionary[Any, threading.BoundedSemaphore] = weakref.WeakKeyDictionary()
_SLOTS_LOCK = threading.Lock()


def _new_slots() -> None:
    # A thread of the parent may have held a slot (or the lock) at the fork.
    global _SLOTS_LOCK
    _SLOTS_LOCK = threading.Lock()
    _SLOTS.clear()


_fork.in_child(_new_slots)


@contextlib.contextmanager
def client_slot(client: Any, timeout: float) -> Iterator[None]:
    """A call through ``client``'s own methods, once one of its CLIENT_CALLS is free;
    ReplyTimedOut if none is within ``timeout`` (its calls hang: a node down)."""
    slots = _SLOTS.get(client)
    if slots is None:
        with _SLOTS_LOCK:
            slots = _SLOTS.setdefault(client, threading.BoundedSemaphore(CLIENT_CALLS))
    if not slots.acquire(timeout=timeout):
        raise ReplyTimedOut(f"{CLIENT_CALLS} calls through the client under way for {timeout}s")
    try:
        yield
    finally:
        slots.release()


def meet_cluster(client: Any) -> None:
    """A blocking Cluster client learns its nodes when it is made: nothing to do."""


# Connections (see ``_sync.conn``) -----------------------------------------------------

TimedOut = TimeoutError  # what a connect that took too long raises

RECV_FLAGS = socket.MSG_DONTWAIT  # a poll never waits (a read's wait is bounded by SO_RCVTIMEO)


class _Process:
    """The owner of every blocking pool: the process (a forked child starts them over)."""


_PROCESS = _Process()


def pool_owner() -> _Process:
    """Whose pools a connection is taken from: the process's (threads share them)."""
    return _PROCESS


Guard = threading.Lock  # a pool's or hub's state is shared by threads

Freed = threading.Condition  # wakes the threads waiting for a pool's connection


def _timeval(seconds: float) -> bytes:
    # 0 would mean "no limit" to the kernel
    whole, fraction = divmod(max(seconds, SHORTEST_WAIT), 1.0)
    return struct.pack("ll", int(whole), int(fraction * 1e6))


def connect(endpoint: Endpoint, bound: float) -> socket.socket:
    """A blocking socket connected to ``endpoint`` within ``bound`` (TimedOut, or an
    OSError), whose writes are bounded by ``bound`` too (SO_SNDTIMEO)."""
    if endpoint.path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(bound)
            sock.connect(endpoint.path)
        except BaseException:
            sock.close()
            raise
    else:
        sock = socket.create_connection((endpoint.host, endpoint.port), bound)
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(bound))
    return sock


def sender(sock: socket.socket) -> Callable[[bytes], None]:
    """How ``data`` is written to ``sock``: one ``sendall`` (BlockingIOError once the
    write bound passed)."""
    return sock.sendall


poll = _resp.poll


class SocketWait:
    """How a socket's reply is waited for once polling gave up: one ``recv_into`` in the
    kernel, bounded by SO_RCVTIMEO."""

    __slots__ = ("bound", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.bound = -1.0  # the receive bound currently set on the socket

    def read(self, buffer: bytearray, reader: Any, record: _resp.SpinRecord, timeout: float) -> Any:
        """The next reply into ``reader``, within ``timeout`` (else ReplyTimedOut)."""
        # Whole milliseconds, rounded up: the reads of one fan-out then share a bound and
        # the socket option is rarely set again.
        bound = math.ceil(timeout * 1000) / 1000.0
        if bound != self.bound:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(bound))
            self.bound = bound
        reply = NOT_ENOUGH
        while reply is NOT_ENOUGH:
            try:
                got = self.sock.recv_into(buffer)
            except BlockingIOError:  # the bound passed
                raise ReplyTimedOut(f"no reply within {timeout:.3f}s") from None
            except OSError as exc:
                raise read_failed(exc) from exc
            reply = fed(got, buffer, reader)
        return reply

    def close(self) -> None:
        return None


class ClassConnection:
    """A connection made with the client's own connection class (TLS, Sentinel...), used
    through its public methods only. It owes no stale replies: fan-outs read all of its."""

    lean = False
    stale = 0
    client_id: int | None = None
    __slots__ = ("__weakref__", "conn", "wire")  # (a pool counts it weakly)

    def __init__(self, conn: Any, pool: Any) -> None:
        self.conn = conn
        self.wire = pool.wire

    @classmethod
    def open(cls, endpoint: Endpoint, timeout: float, pool: Any) -> ClassConnection:
        conn = endpoint.connection_class(**settings_within(endpoint.class_settings, timeout))
        conn.connect()  # the class's own connect: Sentinel discovery happens here
        return cls(conn, pool)

    def alive(self) -> bool:
        try:
            return not self.conn.can_read(timeout=0)  # readable while idle: closed
        except Exception:
            return False

    def send(self, data: bytes) -> None:
        self.conn.send_packed_command([data], check_health=False)

    def read(self, timeout: float, spin: bool = True) -> Any:
        if not self.conn.can_read(timeout=timeout):
            raise ReplyTimedOut(f"no reply within {timeout:.3f}s")
        return self.conn.read_response()

    def drop_arrived(self) -> Exception | None:
        return None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.disconnect()


# The hub (see ``_sync.conn``) ------------------------------------------------------------


def hub_locks() -> tuple[threading.Lock, threading.Lock]:
    """A hub's two locks, one held across its I/O and its state's guard: the same lock
    (its threads' turns are short)."""
    lock = threading.Lock()
    return lock, lock


def start(reader: Callable[..., None], *args: Any, name: str) -> threading.Thread:
    """``reader(*args)`` running beside the caller: a daemon thread (``_base.threads``)."""
    return _threads.daemon(reader, *args, name=name)


class RingQueue:
    """What a hub's reader puts (a ring, or None), taken by a waiting thread."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put(self, item: Any) -> None:
        self._items.put(item)

    def get(self, timeout: float) -> Any:
        """The next item, or None once ``timeout`` passed."""
        try:
            return self._items.get(timeout=timeout)
        except queue.Empty:
            return None
