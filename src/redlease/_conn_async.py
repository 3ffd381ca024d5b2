"""redlease's own connections to one server, asyncio flavour (twin of ``_conn_sync``).

A ``Pool`` per event loop and server (``pool_for``) keeps them, with the sync pool's
bounds: at most MAX_CONNECTIONS, of which blocking waits may hold all but RESERVED,
MAX_IDLE kept open between uses; never the application's. A connection taken from the
idle list is checked first, without a round trip, and replaced if the server closed it.
asyncio connections belong to one loop: another loop gets a pool of its own, and a
forked child never uses its parent's sockets.

``SocketConnection`` is a non-blocking socket of our own, driven with the loop's public
socket methods (``sock_connect``, ``sock_sendall``, ``sock_recv_into``); a reply due in
about a round trip is first polled for (see ``_spin``), giving the loop a turn between
polls so that other tasks never wait on it. ``ClassConnection`` is one made with the
client's own connection class (TLS, Sentinel), used through its public methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import select
import socket
import sys
import time
import weakref
from collections.abc import AsyncGenerator
from typing import Any

from . import _backend_async, _fork, _resp, _spin, _stale
from ._conn_sync import MAX_CONNECTIONS, MAX_IDLE, OWED_REPLY_LIMIT, RESERVED
from ._endpoint import ConnectionFailed, Endpoint, Kind, ReplyTimedOut, bounded, node_endpoint
from ._hub_async import Hub
from ._hub_sync import PLAIN, SHARDED, Verbs
from ._reading import fed, read_failed

NOT_ENOUGH = _resp.NOT_ENOUGH
_MIN_WAIT = 0.001
# The event loop looks at I/O and timers only between turns, and a read answered by
# polling takes none: after this long without one, a read lets the loop take a turn.
TURN_EVERY = 1e-3


class SocketConnection:
    """A plain TCP or Unix socket of our own, non-blocking. ``stale``: replies owed to
    fan-outs that did not wait for them (see ``_quorum``), dropped before the next."""

    lean = True
    __slots__ = (
        "buffer",
        "client_id",
        "loop",
        "poller",
        "reader",
        "recv",
        "sock",
        "spin",
        "stale",
        "watch",
        "wire",
    )

    def __init__(self, sock: socket.socket, pool: Pool) -> None:
        self.sock = sock
        self.loop = pool.loop
        self.buffer = bytearray(65536)
        self.reader = _resp.new_reader()
        self.recv = functools.partial(sock.recv_into, self.buffer)
        self.spin, self.wire = pool.spin, pool.wire
        self.watch = _Watch()
        self.stale = 0
        self.client_id: int | None = None  # the server's id for it, once asked (CLIENT ID)
        self.poller = select.poll()  # whether anything arrived (see alive)
        self.poller.register(sock, select.POLLIN)

    @classmethod
    async def open(cls, endpoint: Endpoint, timeout: float, pool: Pool) -> SocketConnection:
        limit = endpoint.connect_timeout
        bound = timeout if limit is None else min(limit, timeout)
        loop = pool.loop
        try:
            async with _backend_async.deadline(bound):
                sock = await _connect(loop, endpoint)
        except asyncio.TimeoutError as exc:
            raise ReplyTimedOut(f"no connection to {endpoint.label} within {bound:.3f}s") from exc
        except OSError as exc:
            raise ConnectionFailed(f"cannot connect to {endpoint.label}: {exc}") from exc
        conn = cls(sock, pool)
        try:
            await conn._handshake(endpoint, bound)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _handshake(self, endpoint: Endpoint, timeout: float) -> None:
        """AUTH, SELECT and CLIENT SETNAME as configured, in one write."""
        commands: list[tuple[str, ...]] = []
        credentials = endpoint.credentials()
        if credentials:
            commands.append(("AUTH", *credentials))
        if endpoint.db:
            commands.append(("SELECT", str(endpoint.db)))
        if endpoint.client_name:
            commands.append(("CLIENT", "SETNAME", endpoint.client_name))
        if not commands:
            return
        await self.send(b"".join(_resp.command(c) for c in commands))
        for _ in commands:
            await self.read(timeout, spin=False)

    def alive(self) -> bool:
        """Nothing known to be wrong: the server has not closed it, and sent nothing
        unasked (without a round trip: a poll, then a peek at what arrived, if any)."""
        if not self.poller.poll(0):
            return True
        try:
            data = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return bool(data) and self.stale > 0

    async def send(self, data: bytes) -> None:
        try:
            sent = self.sock.send(data)
            if sent < len(data):
                await self.loop.sock_sendall(self.sock, memoryview(data)[sent:])
        except BlockingIOError:
            await self.loop.sock_sendall(self.sock, data)
        except OSError as exc:
            raise ConnectionFailed(f"error while writing: {exc}") from exc

    async def read(self, timeout: float, spin: bool = True) -> Any:
        """The next reply, within ``timeout``; ``spin``: it is due in about a round trip
        (not a blocking command's reply). An error reply is raised as ReplyError."""
        if self.stale:
            timeout = await self._drop_stale(timeout)
        reply = await self._next(timeout, spin)
        if isinstance(reply, _resp.ReplyError):
            raise reply
        return reply

    async def _drop_stale(self, timeout: float) -> float:
        clock = time.perf_counter
        end = clock() + timeout
        while self.stale:
            reply = await self._next(max(end - clock(), _MIN_WAIT), True)
            _stale.dropped(reply, self.wire.forget)
            self.stale -= 1
        return max(end - clock(), _MIN_WAIT)

    def drop_arrived(self) -> Exception | None:
        try:
            self.stale = _stale.drop_arrived(
                self.recv, self.buffer, self.reader, self.stale, self.wire.forget
            )
        except ConnectionFailed as exc:
            return exc
        return None

    async def _next(self, timeout: float, spin: bool) -> Any:
        """The next reply as parsed (an error reply is returned, not raised)."""
        reader = self.reader
        reply = reader.gets()
        if reply is NOT_ENOUGH:
            if _cancel_due():
                await asyncio.sleep(0)  # it lands at this read, as the caller asked
            if spin and _spin.BUDGET > 0:
                started = time.perf_counter()
                reply = await _spin.poll_async(self.recv, self.buffer, reader, self.spin)
                if reply is not NOT_ENOUGH:
                    if started - self.spin.turned > TURN_EVERY:
                        self.spin.turned = started
                        await asyncio.sleep(0)  # polled replies in a row: let the loop turn
                    return reply
                timeout = max(timeout - (time.perf_counter() - started), _MIN_WAIT)
            reply = await self.watch.read(self, timeout)
            self.spin.turned = time.perf_counter()
        return reply

    async def more(self) -> Any:
        """Wait for bytes (no bound: the caller's ``_Watch`` has it) until a reply is in."""
        reader = self.reader
        while True:
            try:
                got = await self.loop.sock_recv_into(self.sock, self.buffer)
            except OSError as exc:
                raise read_failed(exc) from exc
            reply = fed(got, self.buffer, reader)
            if reply is not NOT_ENOUGH:
                return reply

    def close(self) -> None:
        self.watch.close()
        with contextlib.suppress(OSError):
            self.sock.close()

    async def shut(self) -> None:
        """Close it, from the loop (as at its shutdown)."""
        self.close()


async def _connect(loop: asyncio.AbstractEventLoop, endpoint: Endpoint) -> socket.socket:
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
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if endpoint.keepalive:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in endpoint.keepalive_options.items():
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
        return sock
    raise error


def _cancel_due() -> bool:
    """The running task has been asked to cancel (a read must then wait, not poll or
    take what arrived, so that the cancellation lands there). Needs 3.11."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is not None and cancelling() > 0


# A timer per read (asyncio.timeout) costs a timer-heap push and leaves a cancelled
# handle behind, a few percent of a lock cycle. A connection's reads share one timer
# instead, armed when none is pending and moved only when it fires early: it fires about
# once per timeout, not once per read. It needs Task.cancelling()/uncancel() (3.11) to
# tell its own cancellation from the caller's, and the nested-cancellation fixes of
# 3.11.3; older versions bound each read with a timeout of its own.
_LAZY_DEADLINES = sys.version_info >= (3, 11, 3)


class _Watch:
    """The deadline of the read in progress on one connection (see _LAZY_DEADLINES)."""

    __slots__ = ("due", "expired", "handle", "task")

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None  # the task reading, while it reads
        self.due = 0.0
        self.expired = False
        self.handle: asyncio.TimerHandle | None = None

    async def read(self, conn: SocketConnection, timeout: float) -> Any:
        if not _LAZY_DEADLINES:
            return await _backend_async.bounded(conn.more, timeout)
        loop = conn.loop
        task = asyncio.current_task()
        assert task is not None
        self.task, self.due, self.expired = task, loop.time() + timeout, False
        if self.handle is None or self.handle.when() > self.due:
            if self.handle is not None:
                self.handle.cancel()
            self.handle = loop.call_at(self.due, self._fire, loop)
        cancelling = task.cancelling()  # type: ignore[attr-defined,unused-ignore]
        try:
            return await conn.more()
        except asyncio.CancelledError:
            if self.expired and task.uncancel() <= cancelling:  # type: ignore[attr-defined,unused-ignore]
                raise ReplyTimedOut(f"no reply within {timeout:.3f}s") from None
            raise  # the caller's own cancellation
        finally:
            self.task = None

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self.handle = None
        if self.task is None:
            return  # no read in progress: the next one arms it again
        if loop.time() >= self.due:
            self.expired = True
            self.task.cancel()
        else:  # armed for an earlier read: move it to this one's deadline
            self.handle = loop.call_at(self.due, self._fire, loop)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class ClassConnection:
    """A connection made with the client's own connection class (TLS, Sentinel...), used
    through its public methods only; every read bounded by us (its own ``timeout=``
    answers a timeout with None and keeps the late reply for the next command)."""

    lean = False
    stale = 0
    client_id: int | None = None
    __slots__ = ("conn", "wire")

    def __init__(self, conn: Any, pool: Pool) -> None:
        self.conn = conn
        self.wire = pool.wire

    @classmethod
    async def open(cls, endpoint: Endpoint, timeout: float, pool: Pool) -> ClassConnection:
        conn = endpoint.connection_class(**bounded(endpoint.class_settings, timeout))
        try:
            # the class's own connect (Sentinel discovery happens here), bounded as a whole
            await _backend_async.bounded(conn.connect, timeout)
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
        return await _backend_async.bounded(self.conn.read_response, timeout)

    def drop_arrived(self) -> Exception | None:
        return None

    def close(self) -> None:
        # The class's disconnect is a coroutine: run it on the loop, without waiting.
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().create_task(self.conn.disconnect(nowait=True))

    async def shut(self) -> None:
        """Close it, from the loop (as at its shutdown), and wait for that."""
        with contextlib.suppress(Exception):
            await self.conn.disconnect(nowait=True)


Connection = SocketConnection | ClassConnection


class Pool:
    """redlease's connections to one server, for one event loop (see the module
    docstring). Only that loop's tasks use it, so its lists need no lock."""

    def __init__(
        self, endpoint: Endpoint, loop: asyncio.AbstractEventLoop, hub_verbs: Verbs = PLAIN
    ) -> None:
        self.endpoint = endpoint
        self.loop = loop
        self.hub_verbs = hub_verbs  # sharded pub/sub for a Cluster node
        self._open = SocketConnection.open if endpoint.kind is Kind.SOCKET else ClassConnection.open
        self.wire = _resp.Wire()
        self.spin = _spin.Record()
        self._freed = asyncio.Event()
        self._idle: list[Connection] = []
        self._owing: list[tuple[Connection, float]] = []
        self._count = 0
        self._blocking = 0
        self._generation = _fork.generation
        self._hub: Hub | None = None
        self._shutdown: AsyncGenerator[None, None] | None = None
        weakref.finalize(self, _close_all, self._idle, self._owing)

    async def _closed_at_shutdown(self) -> AsyncGenerator[None, None]:
        """Suspended for the loop's life: the loop closes its async generators when it
        shuts down (``asyncio.run``, ``asyncio.Runner``), and this one then closes the
        idle connections, as only the loop can (a transport cannot close without it)."""
        try:
            yield
        finally:
            idle, owing = list(self._idle), [conn for conn, _ in self._owing]
            self._idle.clear()
            self._owing.clear()
            for conn in idle + owing:
                self._count -= 1
                await conn.shut()

    def current(self) -> bool:
        """Whether this pool is the running loop's (each loop has its own)."""
        return self.loop is asyncio.get_running_loop()

    @property
    def hub(self) -> Hub | None:
        """The loop's shared wait connection to this server (see ``_hub_async``), for
        sockets of our own."""
        if self._hub is None and self.endpoint.kind is Kind.SOCKET:
            self._hub = Hub(self, self.hub_verbs)
        return self._hub

    async def open_connection(self, timeout: float) -> Connection:
        """A new connection, not one of the pool's (the hub's)."""
        return await self._open(self.endpoint, timeout, self)

    async def take(self, timeout: float, *, blocking: bool = False) -> Connection | None:
        if self._shutdown is None:
            self._shutdown = self._closed_at_shutdown()
            await self._shutdown.__anext__()
        if self._generation != _fork.generation:
            self._forget_parents()
        end = time.monotonic() + timeout
        while True:
            conn = self._idle_one()
            if conn is not None:
                if blocking:
                    self._blocking += 1
                return conn
            limit = MAX_CONNECTIONS - RESERVED if blocking else MAX_CONNECTIONS
            in_use = self._blocking if blocking else self._count
            if in_use < limit and self._count < MAX_CONNECTIONS:
                break
            left = end - time.monotonic()
            if left <= 0:
                if blocking:
                    return None
                raise ReplyTimedOut(
                    f"all {MAX_CONNECTIONS} of redlease's connections to "
                    f"{self.endpoint.label} stayed busy for {timeout:.3f}s"
                )
            self._freed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._freed.wait(), left)
        self._count += 1
        if blocking:
            self._blocking += 1
        try:
            conn = await self._open(self.endpoint, timeout, self)
        except BaseException:
            self._gone(blocking)
            raise
        return conn

    def _dead(self, conn: Connection) -> None:
        """``conn`` was found closed by the server: it goes, and the scripts with it."""
        conn.close()
        self._count -= 1
        self.wire.forget()

    def _idle_one(self) -> Connection | None:
        if self._owing:
            self._settle_owing()
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.alive():
                return conn
            self._dead(conn)
        return None

    def _settle_owing(self) -> None:
        now = time.monotonic()
        for entry in list(self._owing):
            conn, until = entry
            failure = conn.drop_arrived()
            if failure is None and not conn.stale:
                self._owing.remove(entry)
                self._idle.append(conn)
            elif failure is not None or now >= until:
                self._owing.remove(entry)
                conn.close()
                self._count -= 1

    def give(self, conn: Connection, *, blocking: bool = False) -> None:
        if blocking:
            self._blocking -= 1
        if self._generation == _fork.generation and len(self._idle) < MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.close()
            self._count -= 1
        self._freed.set()

    def owe(self, conn: Connection, *, blocking: bool = False) -> None:
        if not isinstance(conn, SocketConnection):
            self.discard(conn, blocking=blocking)
            return
        conn.stale += 1
        if blocking:
            self._blocking -= 1
        self._owing.append((conn, time.monotonic() + OWED_REPLY_LIMIT))
        self._freed.set()

    def discard(self, conn: Connection, *, blocking: bool = False) -> None:
        conn.close()
        self.wire.forget()
        self._gone(blocking)

    def _gone(self, blocking: bool) -> None:
        self._count -= 1
        if blocking:
            self._blocking -= 1
        self._freed.set()

    def _forget_parents(self) -> None:
        for conn in self._idle:
            conn.close()
        for conn, _ in self._owing:
            conn.close()
        self._idle.clear()
        self._owing.clear()
        self._count = self._blocking = 0
        self._generation = _fork.generation

    def idle_connections(self) -> list[Connection]:
        """The idle connections, in the order they would be taken last to first."""
        return list(self._idle)


def _close_all(idle: list[Connection], owing: list[tuple[Connection, float]]) -> None:
    for conn in idle:
        if isinstance(conn, SocketConnection):
            conn.close()
    for conn, _ in owing:
        conn.close()


_POOLS: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, Pool]] = (
    weakref.WeakKeyDictionary()
)


def pool_for(client: Any, endpoint: Endpoint) -> Pool:
    """The pool of redlease's connections to ``client``'s server for the running loop,
    shared by every lock on that client."""
    loop = asyncio.get_running_loop()
    per_loop = _POOLS.get(client.connection_pool)
    if per_loop is None:
        per_loop = _POOLS[client.connection_pool] = weakref.WeakKeyDictionary()
    pool = per_loop.get(loop)
    if pool is None:
        pool = per_loop[loop] = Pool(endpoint, loop)
    return pool


# A Cluster client's nodes, per loop and name: pools for their hubs only (commands go
# through the client, which routes them).
_NODE_POOLS: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, dict[str, Pool]]] = (
    weakref.WeakKeyDictionary()
)


def node_pool(client: Any, node: Any) -> Pool | None:
    """The running loop's pool (for its hub, sharded) of ``node``, a node of the Cluster
    ``client``; None while redlease cannot open sockets of its own to it (TLS, or its
    settings not known yet: asked again next time)."""
    loop = asyncio.get_running_loop()
    per_loop = _NODE_POOLS.get(client)
    if per_loop is None:
        per_loop = _NODE_POOLS[client] = weakref.WeakKeyDictionary()
    nodes = per_loop.get(loop)
    if nodes is None:
        nodes = per_loop[loop] = {}
    pool = nodes.get(node.name)
    if pool is None:
        endpoint = node_endpoint(client, node, asyncio=True)
        if endpoint.kind is not Kind.SOCKET:
            return None
        pool = nodes[node.name] = Pool(endpoint, loop, SHARDED)
    return pool
