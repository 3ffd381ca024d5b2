"""The blocking driver: carries the core's operations to a redis-py client.

Twin of ``_io_async.py``: same names, same order; any difference is I/O only.

Hot path. For a plain ``redis.Redis`` the driver keeps a few connections of its own, made
with the client's own connection class and settings (host, TLS, ACL user, Sentinel
discovery...), and writes and reads on them directly: redis-py's command path costs more
than the round trip itself. Anything else (``RedisCluster``, other client types) goes
through the client's public methods, which route each script to the node owning the
lock's hash slot.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import socket
import ssl
import struct
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
from redis import exceptions as rx
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import _flows, _resp, _spin
from ._backend_errors import BACKEND_FAILURES, backend_error
from ._errors import RedleaseWarning
from ._flows import Call, Command, Flow, Op, Replicas, Wait
from ._quorum import MIN_READ_WAIT, UNREAD, Unsent, said_yes

T = TypeVar("T")

MAX_IDLE_CONNECTIONS = 8

# Seconds of idleness after which a kept connection is checked before use.
STALE_AFTER = 1.0
_READ_TAKES_TIMEOUT = "timeout" in inspect.signature(redis.Connection.read_response).parameters
# Servers (by pool, or client if it has none) already checked for a key-evicting policy.
_CHECKED: weakref.WeakSet[Any] = weakref.WeakSet()


def _close_idle(idle: list[tuple[Any, float]]) -> None:
    while idle:
        conn, _ = idle.pop()
        with contextlib.suppress(Exception):
            conn.disconnect()


class _Connections:
    """Idle connections of this driver to one server, made with the client's own
    connection class and settings, so TLS, ACL users and Sentinel discovery apply.

    They are not the pool's: every use is bounded by the operation's own timeout,
    including a new connection's handshake, which redis-py would otherwise wait for as
    long as the client's ``socket_timeout`` allows (forever by default) when a server
    hangs. They close when the client's pool goes away. ``list.pop``/``append`` are
    atomic, so threads share this without a lock; after ``fork`` the child starts with
    none (a socket must never be shared with the parent)."""

    def __init__(self, pool: Any) -> None:
        self._cls = pool.connection_class
        self._settings = _resp.private_connection_settings(pool.connection_kwargs)
        self._idle: list[tuple[Any, float]] = []
        self.wire = _resp.Wire()  # each op as bytes for this server
        self.spin = _spin.Record()  # whether reads from this server poll before sleeping
        _ALL_CONNECTIONS.add(self)
        # Close what is idle when this goes away, or at interpreter exit at the latest.
        weakref.finalize(self, _close_idle, self._idle)

    def take(self, timeout: float) -> Any:
        idle = self._idle
        while idle:
            conn, since = idle.pop()
            # A connection idle for a while may have been closed by the server (restart,
            # idle timeout): one poll tells, before a command is lost on it.
            if time.monotonic() - since < STALE_AFTER:
                return conn
            lean: _Lean | None = conn._redlease_lean
            if lean is not None and lean.stale and (lean.drop_arrived() or lean.stale):
                conn.disconnect()  # failed, or replies owed for a second: the server is stuck
                continue
            if not conn.can_read():
                _Lean.attach(conn, self)  # can_read() put the socket back in timeout mode
                return conn
            conn.disconnect()
        conn = self._cls(**_resp.bounded(self._settings, timeout, Retry(NoBackoff(), 0)))
        conn.connect()  # the class's own connect: Sentinel discovery happens here
        _Lean.attach(conn, self)
        return conn

    def give(self, conn: Any) -> None:
        if len(self._idle) < MAX_IDLE_CONNECTIONS:
            self._idle.append((conn, time.monotonic()))
        else:
            conn.disconnect()

    def discard(self, conn: Any) -> None:
        """A connection whose state is unknown (a reply may still be on its way)."""
        conn.disconnect()
        self.wire.forget()  # the server may have restarted without its scripts


_ALL_CONNECTIONS: weakref.WeakSet[_Connections] = weakref.WeakSet()


def _forget_parents_connections() -> None:
    # A forked child must never use its parent's sockets: it starts with no idle ones.
    # (Cleared, not closed: redis-py only shuts a socket down in the process that made it.)
    for connections in list(_ALL_CONNECTIONS):
        connections._idle.clear()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_forget_parents_connections)


_NOT_ENOUGH = _spin.NOT_ENOUGH


def _timeval(seconds: float) -> bytes:
    # 0 would mean "no limit" to the kernel: the shortest bound is 1 ms
    whole, fraction = divmod(max(seconds, 0.001), 1.0)
    return struct.pack("ll", int(whole), int(fraction * 1e6))


class _Lean:
    """The short way through a plain TCP or Unix socket: written with ``sendall`` and read
    with ``recv_into`` into the connection's own hiredis reader, the socket blocking but
    bounded by SO_RCVTIMEO/SO_SNDTIMEO. One system call per read, where redis-py's
    ``read_response(timeout=)`` makes four (two timeout switches, a poll, the recv).
    Only for RESP2 connections parsed by hiredis; anything else (TLS, the pure-Python
    parser, RESP3 with its push messages) keeps redis-py's own path.

    Only these connections may owe ``stale`` replies, the ones a fan-out did not wait
    for (see ``_quorum.Fanout``): the next read drops them first."""

    __slots__ = ("buffer", "reader", "recv", "sock", "spin", "stale", "wait", "wire")
    # ``stale``: replies owed to fan-outs that did not wait for them (see ``_spin``)

    def __init__(
        self, sock: socket.socket, reader: Any, buffer: bytearray, owner: _Connections
    ) -> None:
        self.sock, self.reader, self.buffer = sock, reader, buffer
        self.spin, self.wire = owner.spin, owner.wire
        self.recv = functools.partial(sock.recv_into, buffer, 0, socket.MSG_DONTWAIT)
        self.wait = -1.0  # the receive bound currently set on the socket
        self.stale = 0

    @staticmethod
    def attach(conn: Any, owner: _Connections) -> None:
        sock: Any = getattr(conn, "_sock", None)
        parser = getattr(conn, "_parser", None)
        reader = getattr(parser, "_reader", None)
        buffer = getattr(parser, "_buffer", None)
        plain = (
            isinstance(sock, socket.socket)
            and not isinstance(sock, ssl.SSLSocket)
            and str(getattr(conn, "protocol", 2)) == "2"
            and sys.platform != "win32"  # SO_RCVTIMEO takes a timeval only on POSIX
        )
        if not plain or not isinstance(buffer, bytearray) or not hasattr(reader, "gets"):
            conn._redlease_lean = None
            return
        bound = sock.gettimeout() or 1.0  # the connection's own: our op bound, or less
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(bound))
        conn._redlease_lean = _Lean(sock, reader, buffer, owner)

    def read(self, timeout: float, spin: bool = True) -> Any:
        """The next reply, within ``timeout``; ``spin``: it is due in about a round trip
        (not a blocking command's reply)."""
        if self.stale:
            timeout = self._drop_stale(timeout)
        reply = self._next(timeout, spin)
        if isinstance(reply, (rx.ResponseError, rx.ConnectionError)):
            raise reply
        return reply

    def _drop_stale(self, timeout: float) -> float:
        """Read the stale replies and drop them; the time left of ``timeout``."""
        clock = time.perf_counter
        end = clock() + timeout
        while self.stale:
            _spin.dropped(self._next(max(end - clock(), MIN_READ_WAIT), True), self.wire.forget)
            self.stale -= 1
        return max(end - clock(), MIN_READ_WAIT)

    def drop_arrived(self) -> rx.ConnectionError | None:
        """Drop the stale replies already received, without waiting; the error if the
        connection failed."""
        try:
            self.stale = _spin.drop_arrived(
                self.recv, self.buffer, self.reader, self.stale, self.wire.forget
            )
        except rx.ConnectionError as exc:
            return exc
        return None

    def _next(self, timeout: float, spin: bool) -> Any:
        """The next reply as parsed (an error reply is returned, not raised)."""
        reader = self.reader
        reply = reader.gets()
        if reply is _NOT_ENOUGH and spin and _spin.BUDGET > 0:
            started = time.perf_counter()
            reply = _spin.poll(self.recv, self.buffer, reader, self.spin)
            if reply is _NOT_ENOUGH:  # what the spin took counts against the bound
                timeout = max(timeout - (time.perf_counter() - started), MIN_READ_WAIT)
        if reply is _NOT_ENOUGH:
            # Whole milliseconds, rounded up: the reads of one fan-out then share a bound
            # and the socket option is rarely set again.
            wait = math.ceil(timeout * 1000) / 1000.0
            if wait != self.wait:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(wait))
                self.wait = wait
            while reply is _NOT_ENOUGH:
                try:
                    got = self.sock.recv_into(self.buffer)
                except BlockingIOError:  # the bound passed
                    raise rx.TimeoutError(f"no reply within {timeout:.3f}s") from None
                except OSError as exc:
                    raise rx.ConnectionError(f"error while reading: {exc}") from exc
                if not got:
                    raise rx.ConnectionError("connection closed by server")
                reader.feed(self.buffer, 0, got)
                reply = reader.gets()
        return reply

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except BlockingIOError:
            raise rx.TimeoutError("timed out writing to the server") from None
        except OSError as exc:
            raise rx.ConnectionError(f"error while writing: {exc}") from exc


def _send(conn: Any, data: bytes) -> None:
    lean: _Lean | None = conn._redlease_lean
    if lean is None:
        conn.send_packed_command([data], check_health=False)
    else:
        lean.send(data)


def _read(conn: Any, timeout: float, spin: bool = True) -> Any:
    lean: _Lean | None = conn._redlease_lean
    if lean is not None:
        return lean.read(timeout, spin)
    if _READ_TAKES_TIMEOUT:
        return conn.read_response(timeout=timeout)
    if not conn.can_read(timeout=timeout):
        raise rx.TimeoutError(f"no reply within {timeout:.3f}s")
    return conn.read_response()


def _reply(conn: Any, op: Call | Command, timeout: float) -> Any:
    """The reply to ``op``, just written on ``conn``; a script the server has lost is
    sent again with its source."""
    try:
        return _read(conn, timeout)
    except rx.NoScriptError:
        assert isinstance(op, Call)
        _send(conn, _resp.eval_source(op))
        return _read(conn, timeout)


def _replicas_acked(conn: Any, replicas: Replicas, timeout: float) -> int:
    """WAIT on the connection that made the write: how many replicas have it."""
    _send(conn, _resp.command(("WAIT", str(replicas.count), str(replicas.timeout_ms))))
    return int(_read(conn, replicas.timeout_ms / 1000.0 + timeout, spin=False))


class SyncIO:
    """Runs flows against one sync client."""

    def __init__(self, client: Any) -> None:
        self.client = client
        pool = getattr(client, "connection_pool", None)
        self._direct: _Connections | None = None
        self._checked = False
        if isinstance(client, redis.Redis) and hasattr(pool, "connection_class"):
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

    def run(self, flow: Flow[T], action: str) -> T:
        """Drive ``flow`` to its end; server failures are thrown into it as BackendError."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            try:
                reply, error = self.execute(op), None
            except BACKEND_FAILURES as exc:
                reply, error = None, backend_error(exc, action)

    def execute(self, op: Op) -> Any:
        if isinstance(op, Call):
            return self._call(op)
        if isinstance(op, Wait):
            return self._wait(op)
        return self._command(op)

    def check_server_once(self) -> None:
        """Warn (once per client) if the server may evict lock keys; never fails."""
        if self._checked:
            return
        self._checked = True
        target = getattr(self.client, "connection_pool", None) or self.client
        if target in _CHECKED:
            return
        _CHECKED.add(target)
        try:
            reply = self._command(_flows.MAXMEMORY_POLICY)
        except BACKEND_FAILURES:
            return  # CONFIG may be renamed or denied by ACL: nothing to learn
        message = _flows.eviction_warning(reply)
        if message:
            warnings.warn(f"{self.describe()}: {message}", RedleaseWarning, stacklevel=4)

    def execute_many(self, ops: Sequence[Call]) -> list[Any]:
        """Pipeline ``ops`` on one connection: one round trip for all (used for batched
        renewals). Each result is the reply, or the BackendError for that op."""
        direct = self._direct
        if direct is None:
            replies: list[Any] = []
            for op in ops:
                try:
                    replies.append(self.execute(op))
                except BACKEND_FAILURES as exc:
                    replies.append(backend_error(exc, "batch"))
            return replies
        conn = direct.take(min(op.timeout for op in ops))
        results: list[Any] = []
        try:
            _send(conn, b"".join(map(direct.wire, ops)))
            for op in ops:
                try:
                    results.append(_read(conn, op.timeout))
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
                    _send(conn, _resp.command(("SCRIPT", "LOAD", script.source)))
                    _read(conn, ops[0].timeout)
                _send(conn, b"".join(_resp.evalsha(ops[i]) for i in missing))
                for i in missing:
                    op = ops[i]
                    try:
                        results[i] = _read(conn, op.timeout)
                    except rx.ResponseError as exc:
                        results[i] = backend_error(exc, op.script.name)
        except BACKEND_FAILURES as exc:
            direct.discard(conn)
            error = backend_error(exc, "batch")
            return results + [error] * (len(ops) - len(results))
        except BaseException:
            direct.discard(conn)
            raise
        direct.give(conn)
        return results

    # -- operations --------------------------------------------------------------------

    def _call(self, op: Call) -> Any:
        if self._direct is None:
            n = len(op.keys)
            try:
                return self.client.evalsha(op.script.sha, n, *op.keys, *op.args)
            except rx.NoScriptError:
                return self.client.eval(op.script.source, n, *op.keys, *op.args)
        conn = self._direct.take(op.timeout)
        try:
            _send(conn, self._direct.wire(op))
            reply = _reply(conn, op, op.timeout)
            if op.replicas is not None:
                reply = (reply, _replicas_acked(conn, op.replicas, op.timeout))
        except rx.ResponseError:
            self._direct.give(conn)  # the reply was read in full: the connection is clean
            raise
        except BaseException:
            self._direct.discard(conn)  # a reply may still be on its way
            raise
        self._direct.give(conn)
        return reply

    def _command(self, op: Command) -> Any:
        if self._direct is None:
            return self.client.execute_command(*op.args)
        conn = self._direct.take(op.timeout)
        try:
            _send(conn, _resp.command(op.args))
            reply = _read(conn, op.timeout)
        except rx.ResponseError:
            self._direct.give(conn)
            raise
        except BaseException:
            self._direct.discard(conn)
            raise
        self._direct.give(conn)
        return reply

    def _wait(self, op: Wait) -> Any:
        # A blocked waiter occupies one of the driver's own connections, never one of
        # the client's pool, so waiting cannot starve the application; when woken it
        # goes back to the idle list (at most MAX_IDLE_CONNECTIONS stay open).
        if self._direct is None:
            reply = self.client.blpop([op.key], op.timeout)
            return None if reply is None else reply[1]
        conn = self._direct.take(op.connect_timeout)
        try:
            _send(conn, _resp.command(("BLPOP", op.key, f"{op.timeout:.3f}")))
            reply = _read(conn, op.give_up, spin=False)  # a blocking command
        except rx.TimeoutError:  # the server is late to time it out (see Wait): the
            self._direct.discard(conn)  # BLPOP goes with the connection
            return None if op.replicas is None else (None, 0)
        except BaseException:
            self._direct.discard(conn)
            raise
        try:
            rung = None if reply is None else reply[1]
            if op.replicas is not None:
                acked = 0 if rung is None else _replicas_acked(conn, op.replicas, op.timeout)
                rung = (rung, acked)
        except BaseException:
            self._direct.discard(conn)
            raise
        self._direct.give(conn)
        return rung


def fan_out(
    ios: Sequence[SyncIO],
    op: Call | Command,
    nodes: Sequence[int],
    timeout: float,
    action: str,
    enough: int = 0,
    yes: Callable[[Any], bool] = said_yes,
) -> list[Any]:
    """``op`` on each of ``nodes`` at once: written to every node's connection, then the
    replies read in turn (no thread per node). Each reply is due ``timeout`` after its
    own node's send began: a node that needs a new connection to a hung server (whose
    handshake waits out the timeout) must not use up the others' time.

    One result per node, in order: the reply, or the BackendError that stands for none
    (an ``Unsent`` one when the command never left). A node that did not answer in time
    loses its connection, so a late reply cannot be mistaken for a later command's.
    Once ``enough`` replies satisfy ``yes`` (see ``_quorum.Fanout``), the replies still
    due on lean connections are left to their next read, and their results are UNREAD."""
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
                    results[at] = io.execute(op)
                except BACKEND_FAILURES as exc:
                    results[at] = backend_error(exc, action)
                continue
            try:
                conn = direct.take(timeout)
            except BACKEND_FAILURES as exc:
                results[at] = backend_error(exc, action, Unsent)
                continue
            try:
                _send(conn, direct.wire(op, packed))
            except BaseException as exc:
                direct.discard(conn)  # part of the command may have left
                if not isinstance(exc, BACKEND_FAILURES):
                    raise
                results[at] = backend_error(exc, action)
                continue
            sent.append((at, conn, direct, due))
        for entry in list(sent):
            # while the replies are on their way: drop what earlier fan-outs left unread
            at, conn, direct, _ = entry
            lean = conn._redlease_lean
            failure = lean.drop_arrived() if lean is not None and lean.stale else None
            if failure is not None:
                sent.remove(entry)
                direct.discard(conn)
                results[at] = backend_error(failure, action)
        confirmed = 0
        while sent:
            at, conn, direct, due = sent[0]
            wait = due - clock()
            try:
                results[at] = _reply(conn, op, wait if wait > MIN_READ_WAIT else MIN_READ_WAIT)
            except rx.ResponseError as exc:
                results[at] = backend_error(exc, action)
            except BACKEND_FAILURES as exc:
                del sent[0]
                direct.discard(conn)
                results[at] = backend_error(exc, action)
                continue
            del sent[0]
            direct.give(conn)  # the reply was read in full: the connection is clean
            if enough and yes(results[at]):
                confirmed += 1
                if confirmed >= enough:
                    _leave_unread(sent, results)
                    enough = 0
    finally:
        for _, other, owner, _ in sent:  # interrupted, or a bug: replies still on their way
            owner.discard(other)
    return results


def _leave_unread(sent: list[tuple[int, Any, _Connections, float]], results: list[Any]) -> None:
    """Give back the connections whose replies are still due and may be owed (lean ones
    that owe fewer than MAX_STALE), each reply now stale; the rest stay to be read."""
    for entry in list(sent):
        at, conn, owner, _ = entry
        lean: _Lean | None = conn._redlease_lean
        if lean is not None and lean.stale < _spin.MAX_STALE:
            lean.stale += 1
            sent.remove(entry)
            owner.give(conn)
            results[at] = UNREAD
