"""The asyncio driver: carries the core's operations to a ``redis.asyncio`` client.

Twin of ``_io_sync.py``: same names, same order; any difference is I/O only.

Hot path. For a plain ``redis.asyncio.Redis`` the driver keeps a few connections of its
own (made with the client's connection class and settings) and writes a command straight
into the connection's stream, then awaits the reply: the reply's arrival already proves
the bytes left, so waiting for the write buffer to drain first only adds a loop turn.
Replies are read under the driver's own deadline: redis-py's ``read_response(timeout=)``
answers a timeout with None and leaves the late reply on the connection, where the next
command would read it as its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import time
import warnings
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aredis
from redis import exceptions as rx
from redis._parsers import hiredis as _hiredis_parser
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from . import _flows, _resp, _spin
from ._backend_errors import BACKEND_FAILURES, backend_error
from ._errors import RedleaseWarning
from ._flows import Call, Command, Flow, Op, Replicas, Wait
from ._quorum import MIN_READ_WAIT, UNREAD, Unsent, said_yes

if sys.version_info >= (3, 11, 3):  # earlier 3.11 releases mishandle nested cancellation
    from asyncio import timeout as _deadline  # type: ignore[attr-defined,unused-ignore]
else:  # a dependency of redis-py on these versions
    from async_timeout import timeout as _deadline

T = TypeVar("T")

MAX_IDLE_CONNECTIONS = 8
# Servers (by pool, or client if it has none) already checked for a key-evicting policy.
_CHECKED: weakref.WeakSet[Any] = weakref.WeakSet()


class _Connections:
    """Connections of this driver to one server, made as the sync driver's are (the
    client's connection class and settings, no handshake round trip beyond AUTH and
    SELECT; see ``_resp.private_connection_settings``), every use bounded by the op's
    timeout, a new connection's handshake included. They are entered in the pool's set
    of connections in use, so its limits count them and the client's ``aclose()`` (the
    pool's ``disconnect``) closes them with its own. asyncio connections cannot move
    between loops: a new loop (or a forked child) starts with none."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._cls = pool.connection_class
        self._settings = _resp.private_connection_settings(pool.connection_kwargs)
        self._idle: list[Any] = []
        self.wire = _resp.Wire()  # each op as bytes for this server
        self.spin = _spin.Record()  # whether reads from this server poll before sleeping
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = os.getpid()

    async def take(self, timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._pid != os.getpid():
            for stale in self._idle:  # another loop's (or the parent's): never used here
                self._forget(stale)
            self._idle, self._loop, self._pid = [], loop, os.getpid()
        if self._idle:
            return self._idle.pop()
        conn = self._cls(**_resp.bounded(self._settings, timeout, Retry(NoBackoff(), 0)))
        try:
            # the class's own connect (Sentinel discovery happens here), bounded as a whole
            await asyncio.wait_for(conn.connect(), timeout)
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                await conn.disconnect(nowait=True)
            if isinstance(exc, asyncio.TimeoutError):
                raise rx.TimeoutError(f"no connection within {timeout:.3f}s") from exc
            raise
        in_use = getattr(self._pool, "_in_use_connections", None)
        if isinstance(in_use, set):
            in_use.add(conn)
        conn._redlease_lean = _lean(conn)
        conn._redlease_stale = 0  # replies a fan-out did not wait for (see _read)
        conn._redlease_wire = self.wire
        conn._redlease_watch = _Watch()
        conn._redlease_poll = _Poll(self.spin)
        return conn

    def _forget(self, conn: Any) -> None:
        in_use = getattr(self._pool, "_in_use_connections", None)
        if isinstance(in_use, set):
            in_use.discard(conn)

    async def give(self, conn: Any) -> None:
        if len(self._idle) < MAX_IDLE_CONNECTIONS and self._pid == os.getpid():
            self._idle.append(conn)
        else:
            await self.discard(conn)

    async def discard(self, conn: Any) -> None:
        """Close ``conn`` (its state may be unknown: a reply may still be on its way);
        never raises, as it runs while another error propagates."""
        self._forget(conn)
        self.wire.forget()  # the server may have restarted without its scripts
        conn._redlease_watch.close()
        with contextlib.suppress(BaseException):
            await conn.disconnect(nowait=True)


_NOT_ENOUGH = _spin.NOT_ENOUGH
_HIREDIS_PARSER: Any = getattr(_hiredis_parser, "_AsyncHiredisParser", None)
_hiredis: Any
try:
    import hiredis as _hiredis
except ImportError:  # pragma: no cover - hiredis is optional
    _hiredis = None
# hiredis >= 3.2 tells RESP3 push messages from replies (None: older or no hiredis)
_Push: Any = getattr(_hiredis, "PushNotification", None)


def _lean(conn: Any) -> bool:
    """Whether replies on ``conn`` can be taken straight from its hiredis reader: RESP2,
    or RESP3 (when the client asks for it) if hiredis marks push messages, which are
    skipped: these connections subscribe to nothing."""
    if _HIREDIS_PARSER is None or type(getattr(conn, "_parser", None)) is not _HIREDIS_PARSER:
        return False
    if getattr(conn, "_writer", None) is None:
        return False
    return str(getattr(conn, "protocol", 2)) == "2" or _Push is not None


async def _read(conn: Any, timeout: float, spin: bool = True) -> Any:
    """The next reply on ``conn``; rx.TimeoutError if none came within ``timeout`` (the
    connection is then in an unknown state: the caller drops it). ``spin``: the reply is
    due in about a round trip (not a blocking command's)."""
    if not conn._redlease_lean:
        return await _bounded(conn.read_response(), timeout)  # bounded by us, not timeout=
    if conn._redlease_stale:
        timeout = await _drop_stale(conn, timeout)
    reply = await _next(conn, timeout, spin)
    if isinstance(reply, (rx.ResponseError, rx.ConnectionError)):
        raise reply
    return reply


def _drop_arrived(conn: Any) -> rx.ConnectionError | None:
    """Drop the stale replies already received on ``conn`` (see ``_spin``), without
    waiting: first what the loop has read into its stream, then what is still in the
    socket. The error if the connection failed."""
    reader = conn._parser._reader
    held = _buffered(conn._parser._stream)
    if held:
        reader.feed(held)
    recv = conn._redlease_poll.socket_recv(conn) or _nothing_more
    try:
        conn._redlease_stale = _spin.drop_arrived(
            recv,
            conn._redlease_poll.buffer,
            reader,
            conn._redlease_stale,
            conn._redlease_wire.forget,
        )
    except rx.ConnectionError as exc:
        return exc
    return None


def _buffered(stream: asyncio.StreamReader) -> bytes:
    """The bytes ``stream`` holds already, taken without waiting (b"" if none)."""
    if not getattr(stream, "_buffer", None):
        return b""
    reading = stream.read(65536)
    try:
        reading.send(None)  # with bytes buffered, read() returns without suspending
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except Exception:  # the stream failed: the next read tells
        return b""
    reading.close()
    return b""


def _nothing_more() -> int:
    raise BlockingIOError


async def _drop_stale(conn: Any, timeout: float) -> float:
    """Read the replies a fan-out left unread on ``conn`` (only lean connections carry
    them) and drop them; the time left of ``timeout``."""
    clock = time.perf_counter
    end = clock() + timeout
    while conn._redlease_stale:
        reply = await _next(conn, max(end - clock(), MIN_READ_WAIT), True)
        _spin.dropped(reply, conn._redlease_wire.forget)
        conn._redlease_stale -= 1
    return max(end - clock(), MIN_READ_WAIT)


async def _next(conn: Any, timeout: float, spin: bool) -> Any:
    """The next reply on a lean ``conn`` as parsed (an error reply is returned, not
    raised)."""
    parser = conn._parser  # the reader and stream of the current connect
    reader = parser._reader
    reply = reader.gets()
    if reply is _NOT_ENOUGH and spin and _POLLS and _spin.BUDGET > 0:
        poll: _Poll = conn._redlease_poll
        started = time.perf_counter()
        reply = poll.reply(conn, reader)
        if reply is _NOT_ENOUGH:  # what the poll took counts against the bound
            timeout = max(timeout - (time.perf_counter() - started), MIN_READ_WAIT)
        elif started - poll.record.turned > TURN_EVERY:
            poll.record.turned = started
            await asyncio.sleep(0)  # polled replies in a row: let the loop take a turn
    while reply is _NOT_ENOUGH or (_Push is not None and type(reply) is _Push):
        if reply is not _NOT_ENOUGH:  # a push message: not the reply we wait for
            reply = reader.gets()
            continue
        stream = parser._stream  # not in yet: wait for it, under a deadline
        if _LAZY_DEADLINES:
            reply = await conn._redlease_watch.read(stream, reader, timeout)
        else:
            reply = await _bounded(_more(stream, reader), timeout)
        conn._redlease_poll.record.turned = time.perf_counter()
    return reply


# Polling needs Task.cancelling() (3.11) to leave a due cancellation its await.
_POLLS = sys.version_info >= (3, 11)
# The event loop looks at I/O and timers only between turns, and a read answered by
# polling takes none: after this long without one, a read lets the loop take a turn.
TURN_EVERY = 1e-3


class _Poll:
    """Polling a lean connection's socket before sleeping (see ``_spin``), as the sync
    driver does, but only while no other task is ready to run: a poll holds the event
    loop. It reads the socket itself, past the transport, and only while the stream
    holds no unread bytes, so the bytes stay in order; never a TLS socket."""

    __slots__ = ("buffer", "record", "recv", "transport")

    def __init__(self, record: _spin.Record) -> None:
        self.record = record
        self.buffer = bytearray(16384)
        self.transport: Any = None  # the transport whose socket ``recv`` reads
        self.recv: Any = None

    def reply(self, conn: Any, reader: Any) -> Any:
        """The reply, if polling brings it; _NOT_ENOUGH to wait in the loop after all."""
        # CPython's loop keeps the callbacks due this turn in _ready; any other loop
        # (uvloop) does not say, so it is never held.
        loop = asyncio.get_running_loop()
        ready = getattr(loop, "_ready", None)
        if ready is None or ready:
            return _NOT_ENOUGH
        task = asyncio.current_task(loop)
        if task is None or task.cancelling():  # type: ignore[attr-defined,unused-ignore]
            return _NOT_ENOUGH  # a cancellation is due: it lands at this read, as asked
        recv = self.socket_recv(conn)
        if recv is None:
            return _NOT_ENOUGH
        return _spin.poll(recv, self.buffer, reader, self.record)

    def socket_recv(self, conn: Any) -> Any:
        """A read of ``conn``'s socket past its transport that never waits, or None when
        that would not keep the bytes in order (the stream holds some), or is not
        possible (TLS, no socket, closing: the fd may be reused)."""
        if getattr(conn._parser._stream, "_buffer", True):
            return None
        transport = conn._writer.transport
        if transport is not self.transport:  # a new connect: find its socket
            self.transport, self.recv = transport, None
            sock = transport.get_extra_info("socket")
            if sock is not None and transport.get_extra_info("ssl_object") is None:
                self.recv = functools.partial(os.readv, sock.fileno(), [self.buffer])
        if self.recv is None or transport.is_closing():
            return None
        return self.recv


async def _more(stream: asyncio.StreamReader, reader: Any) -> Any:
    """Feed ``reader`` from ``stream`` until it holds a reply (or a push message)."""
    reply = _NOT_ENOUGH
    while reply is _NOT_ENOUGH:
        data = await stream.read(65536)
        if not data:
            raise rx.ConnectionError("connection closed by server")
        reader.feed(data)
        reply = reader.gets()
    return reply


# A timer per read (asyncio.timeout) costs a timer-heap push and leaves a cancelled
# handle behind, about 4% of a lock cycle. A connection's reads share one timer instead,
# armed when none is pending and moved only when it fires early: it fires about once per
# timeout, not once per read. It needs Task.cancelling()/uncancel() (3.11) to tell its
# own cancellation from the caller's, and the nested-cancellation fixes of 3.11.3.
_LAZY_DEADLINES = sys.version_info >= (3, 11, 3)


class _Watch:
    """The deadline of the read in progress on one connection (see _LAZY_DEADLINES)."""

    __slots__ = ("due", "expired", "handle", "task")

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None  # the task reading, while it reads
        self.due = 0.0
        self.expired = False
        self.handle: asyncio.TimerHandle | None = None

    async def read(self, stream: asyncio.StreamReader, reader: Any, timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self.task, self.due, self.expired = task, loop.time() + timeout, False
        if self.handle is None or self.handle.when() > self.due:
            if self.handle is not None:
                self.handle.cancel()
            self.handle = loop.call_at(self.due, self._fire, loop)
        cancelling = task.cancelling()  # type: ignore[attr-defined,unused-ignore]
        try:
            return await _more(stream, reader)
        except asyncio.CancelledError:
            if self.expired and task.uncancel() <= cancelling:  # type: ignore[attr-defined,unused-ignore]
                raise rx.TimeoutError(f"no reply within {timeout:.3f}s") from None
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


async def _bounded(reading: Awaitable[Any], timeout: float) -> Any:
    try:
        async with _deadline(timeout):
            return await reading
    except asyncio.TimeoutError:
        raise rx.TimeoutError(f"no reply within {timeout:.3f}s") from None


async def _send(conn: Any, packed: bytes) -> None:
    if not conn.is_connected:
        await conn.connect()
        conn._redlease_stale = 0  # a new socket: what the old one owed is gone
    writer = getattr(conn, "_writer", None)
    if writer is None:  # a redis-py without the stream attribute: the public, slower way
        await conn.send_packed_command([packed], check_health=False)
    else:
        writer.write(packed)


async def _reply(conn: Any, op: Call | Command, timeout: float) -> Any:
    """The reply to ``op``, just written on ``conn``; a script the server has lost is
    sent again with its source."""
    try:
        return await _read(conn, timeout)
    except rx.NoScriptError:
        assert isinstance(op, Call)
        await _send(conn, _resp.eval_source(op))
        return await _read(conn, timeout)


async def _replicas_acked(conn: Any, replicas: Replicas, timeout: float) -> int:
    """WAIT on the connection that made the write: how many replicas have it."""
    await _send(conn, _resp.command(("WAIT", str(replicas.count), str(replicas.timeout_ms))))
    return int(await _read(conn, replicas.timeout_ms / 1000.0 + timeout, spin=False))


class AsyncIO:
    """Runs flows against one asyncio client."""

    def __init__(self, client: Any) -> None:
        self.client = client
        pool = getattr(client, "connection_pool", None)
        self._direct: _Connections | None = None
        self._checked = False
        if isinstance(client, aredis.Redis) and hasattr(pool, "connection_class"):
            # Shared by every lock on this client: connections live as long as its pool.
            self._direct = getattr(pool, "_redlease_connections", None)
            if self._direct is None:
                self._direct = _Connections(pool)
                pool._redlease_connections = self._direct  # type: ignore[union-attr]

    @property
    def direct(self) -> bool:
        """True when commands go straight to a connection (a plain client)."""
        return self._direct is not None

    def describe(self) -> str:
        kwargs = getattr(getattr(self.client, "connection_pool", None), "connection_kwargs", {})
        if "host" in kwargs:
            return f"{kwargs['host']}:{kwargs.get('port', 6379)}"
        if "path" in kwargs:
            return str(kwargs["path"])
        return type(self.client).__name__

    # -- running flows ---------------------------------------------------------------

    async def run(self, flow: Flow[T], action: str) -> T:
        """Drive ``flow`` to its end; server failures are thrown into it as BackendError."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            try:
                reply, error = await self.execute(op), None
            except BACKEND_FAILURES as exc:
                reply, error = None, backend_error(exc, action)

    async def execute(self, op: Op) -> Any:
        if isinstance(op, Call):
            return await self._call(op)
        if isinstance(op, Wait):
            return await self._wait(op)
        return await self._command(op)

    async def check_server_once(self) -> None:
        """Warn (once per client) if the server may evict lock keys; never fails."""
        if self._checked:
            return
        self._checked = True
        target = getattr(self.client, "connection_pool", None) or self.client
        if target in _CHECKED:
            return
        _CHECKED.add(target)
        try:
            reply = await self._command(_flows.MAXMEMORY_POLICY)
        except BACKEND_FAILURES:
            return  # CONFIG may be renamed or denied by ACL: nothing to learn
        message = _flows.eviction_warning(reply)
        if message:
            warnings.warn(f"{self.describe()}: {message}", RedleaseWarning, stacklevel=4)

    async def execute_many(self, ops: Sequence[Call]) -> list[Any]:
        """Pipeline ``ops`` on one connection: one round trip for all (used for batched
        renewals). Each result is the reply, or the BackendError for that op."""
        if self._direct is None:
            results: list[Any] = []
            for op in ops:
                try:
                    results.append(await self._call(op))
                except BACKEND_FAILURES as exc:
                    results.append(backend_error(exc, op.script.name))
            return results
        conn = await self._direct.take(min(op.timeout for op in ops))
        results = []
        try:
            await _send(conn, b"".join(map(self._direct.wire, ops)))
            for op in ops:
                try:
                    results.append(await _read(conn, op.timeout))
                except rx.NoScriptError:
                    results.append(None)  # filled in below, once the pipeline is drained
                except rx.ResponseError as exc:
                    results.append(backend_error(exc, op.script.name))
            missing = [i for i, result in enumerate(results) if result is None]
            if missing:
                # The server lost its scripts: load each once, then one more pipeline
                # (not one EVAL round trip per lease).
                scripts = {ops[i].script.sha: ops[i].script for i in missing}
                for script in scripts.values():
                    await _send(conn, _resp.command(("SCRIPT", "LOAD", script.source)))
                    await _read(conn, ops[0].timeout)
                await _send(conn, b"".join(_resp.evalsha(ops[i]) for i in missing))
                for i in missing:
                    op = ops[i]
                    try:
                        results[i] = await _read(conn, op.timeout)
                    except rx.ResponseError as exc:
                        results[i] = backend_error(exc, op.script.name)
        except BACKEND_FAILURES as exc:
            await self._direct.discard(conn)
            error = backend_error(exc, "batch")
            return results + [error] * (len(ops) - len(results))
        except BaseException:
            await self._direct.discard(conn)
            raise
        await self._direct.give(conn)
        return results

    # -- operations --------------------------------------------------------------------

    async def _call(self, op: Call) -> Any:
        if self._direct is None:
            n = len(op.keys)
            try:
                return await self.client.evalsha(op.script.sha, n, *op.keys, *op.args)
            except rx.NoScriptError:
                return await self.client.eval(op.script.source, n, *op.keys, *op.args)
        conn = await self._direct.take(op.timeout)
        try:
            await _send(conn, self._direct.wire(op))
            reply = await _reply(conn, op, op.timeout)
            if op.replicas is not None:
                reply = (reply, await _replicas_acked(conn, op.replicas, op.timeout))
        except rx.ResponseError:
            await self._direct.give(conn)  # the reply was read in full: the connection is clean
            raise
        except BaseException:
            await self._direct.discard(conn)  # a reply may still be on its way
            raise
        await self._direct.give(conn)
        return reply

    async def _command(self, op: Command) -> Any:
        if self._direct is None:
            return await self.client.execute_command(*op.args)
        conn = await self._direct.take(op.timeout)
        try:
            await _send(conn, _resp.command(op.args))
            reply = await _read(conn, op.timeout)
        except rx.ResponseError:
            await self._direct.give(conn)
            raise
        except BaseException:
            await self._direct.discard(conn)
            raise
        await self._direct.give(conn)
        return reply

    async def _wait(self, op: Wait) -> Any:
        # A blocked waiter occupies one of the driver's connections (counted by the
        # pool's limit, as any BLPOP would be) and hands it back when woken; only up to
        # MAX_IDLE_CONNECTIONS are kept between uses.
        if self._direct is None:
            reply = await self.client.blpop([op.key], op.timeout)
            return None if reply is None else reply[1]
        conn = await self._direct.take(op.connect_timeout)
        try:
            await _send(conn, _resp.command(("BLPOP", op.key, f"{op.timeout:.3f}")))
            reply = await _read(conn, op.give_up, spin=False)  # a blocking command
        except rx.TimeoutError:  # the server is late to time it out (see Wait): the
            await self._direct.discard(conn)  # BLPOP goes with the connection
            return None if op.replicas is None else (None, 0)
        except BaseException:
            await self._direct.discard(conn)
            raise
        try:
            rung = None if reply is None else reply[1]
            if op.replicas is not None:
                acked = 0 if rung is None else await _replicas_acked(conn, op.replicas, op.timeout)
                rung = (rung, acked)
        except BaseException:
            await self._direct.discard(conn)
            raise
        await self._direct.give(conn)
        return rung


async def fan_out(
    ios: Sequence[AsyncIO],
    op: Call | Command,
    nodes: Sequence[int],
    timeout: float,
    action: str,
    enough: int = 0,
    yes: Callable[[Any], bool] = said_yes,
) -> list[Any]:
    """Twin of the sync ``fan_out``: ``op`` written to every node's connection (no task
    per node), then the replies read in turn, each due ``timeout`` after its own node's
    send began. One result per node: the reply, or the BackendError that stands for none
    (``Unsent`` when the command never left). A node that did not answer in time, or
    whose read was cancelled, loses its connection. Once ``enough`` replies satisfy
    ``yes``, the replies still due on lean connections are left to their next read, and
    their results are UNREAD."""
    clock = time.monotonic
    packed: dict[int, bytes] = {}  # the op's bytes, packed once for all nodes
    results: list[Any] = [None] * len(nodes)
    sent: list[tuple[int, Any, _Connections, float]] = []  # (result index, conn, owner, due)
    try:
        for at, i in enumerate(nodes):
            io = ios[i]
            direct = io._direct
            due = clock() + timeout
            if direct is None:  # no direct path: the client's own call, one node at a time
                try:
                    results[at] = await _bounded(io.execute(op), timeout)
                except BACKEND_FAILURES as exc:
                    results[at] = backend_error(exc, action)
                continue
            try:
                conn = await direct.take(timeout)
            except BACKEND_FAILURES as exc:
                results[at] = backend_error(exc, action, Unsent)
                continue
            try:
                await _send(conn, direct.wire(op, packed))
            except BaseException as exc:
                await direct.discard(conn)  # part of the command may have left
                if not isinstance(exc, BACKEND_FAILURES):
                    raise
                results[at] = backend_error(exc, action)
                continue
            sent.append((at, conn, direct, due))
        for entry in list(sent):
            # while the replies are on their way: drop what earlier fan-outs left unread
            at, conn, direct, _ = entry
            failure = _drop_arrived(conn) if conn._redlease_stale else None
            if failure is not None:
                sent.remove(entry)
                await direct.discard(conn)
                results[at] = backend_error(failure, action)
        confirmed = 0
        while sent:
            at, conn, direct, due = sent[0]
            wait = due - clock()
            try:
                results[at] = await _reply(
                    conn, op, wait if wait > MIN_READ_WAIT else MIN_READ_WAIT
                )
            except rx.ResponseError as exc:
                results[at] = backend_error(exc, action)
            except BACKEND_FAILURES as exc:
                del sent[0]
                await direct.discard(conn)
                results[at] = backend_error(exc, action)
                continue
            del sent[0]
            await direct.give(conn)  # the reply was read in full: the connection is clean
            if enough and yes(results[at]):
                confirmed += 1
                if confirmed >= enough:
                    await _leave_unread(sent, results)
                    enough = 0
    finally:
        for _, other, owner, _ in sent:  # cancelled, or a bug: replies still on their way
            await owner.discard(other)
    return results


async def _leave_unread(
    sent: list[tuple[int, Any, _Connections, float]], results: list[Any]
) -> None:
    """Twin of the sync one: give back the connections whose replies are still due and
    may be owed (lean ones that owe fewer than MAX_STALE), each reply now stale."""
    for entry in list(sent):
        at, conn, owner, _ = entry
        if conn._redlease_lean and conn._redlease_stale < _spin.MAX_STALE:
            conn._redlease_stale += 1
            sent.remove(entry)
            await owner.give(conn)
            results[at] = UNREAD
