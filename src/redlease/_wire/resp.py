"""The wire, for both drivers: RESP out and in, and how a reply is read off a socket.

Out: the lock's commands are short lists of str; packing them here (in C when hiredis is
installed) skips a client's general-purpose argument handling on the hot path. In:
replies are parsed by ``hiredis.Reader`` when installed, else by ``PyReader`` (RESP2,
which is all redlease's own connections speak); either returns an error reply as a
``ReplyError`` (not raised) and ``NOT_ENOUGH`` while a reply is incomplete. Between the
two, the one read step every reader shares (``fed``, ``buffered``, ``received``: the
connections' blocking and asyncio reads, the spinning poll, the stale replies' drop) and
the spin-then-block rule (``poll``; docs/design.md, "Connections and timeouts"): a reply
from a server on this host or a fast link comes back within tens of microseconds, sooner
than the kernel wakes a sleeping reader, so a read first polls its socket for up to
BUDGET seconds, giving the CPU away between polls, and gives up at once if that showed
another task wanted the CPU. After MISSES straight polls without the reply (a slow link,
a busy machine), reads from that server sleep right away for the next REST reads.
REDLEASE_SPIN_US sets the budget; 0 turns spinning off.
"""

from __future__ import annotations

import functools
import math
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

from .._base.errors import RedleaseWarning
from .._clients import ConnectionFailed, NotRedis
from .._clients.errors import (
    ReplyError,
    is_function_missing,
    is_noscript,
    refuses_eval,
    refuses_functions,
)
from .._rules import scripts as _scripts
from .._rules.ops import Call, Command

NOT_ENOUGH: Any = object()  # what a reader's gets() returns until a whole reply is in


Pack = Callable[[tuple[str, ...]], bytes]


def _pack_python(parts: tuple[str, ...]) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part if isinstance(part, bytes) else part.encode()  # (a fenced command's data)
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


pack: Pack = _pack_python
_hiredis: Any
try:
    import hiredis as _hiredis
except ImportError:  # pragma: no cover - hiredis is optional
    _hiredis = None
else:
    pack = _hiredis.pack_command


def evalsha(op: Call) -> bytes:
    return pack(("EVALSHA", op.script.sha, str(len(op.keys)), *op.keys, *op.args))


def eval_source(op: Call) -> bytes:
    return pack(("EVAL", op.script.source, str(len(op.keys)), *op.keys, *op.args))


def fcall(op: Call) -> bytes:
    return pack(("FCALL", op.script.function, str(len(op.keys)), *op.keys, *op.args))


@functools.cache
def function_load() -> bytes:
    """FUNCTION LOAD of the library of every script (no REPLACE: a server that has it
    says so at once, without compiling it again)."""
    return pack(("FUNCTION", "LOAD", _scripts.library().source))


def command(args: tuple[str, ...]) -> bytes:
    return pack(args)


def lacking(error: BaseException) -> bool:
    """Whether an error reply says the server lacks a script or function (or refuses
    functions): the op did not run, and is sent again as ``Wire.again`` says."""
    return is_noscript(error) or is_function_missing(error) or refuses_functions(error)


_COMMAND, _EVALSHA, _EVAL, _FCALL = 0, 1, 2, 3


def _command_bytes(op: Command) -> bytes:
    return command(op.args)


_PACKERS: tuple[Callable[[Any], bytes], ...] = (_command_bytes, evalsha, eval_source, fcall)


class Wire:
    """How ops go on the wire to one server, and what it was sent.

    A script goes as FCALL of its function while the server takes functions (assumed
    until it refuses them: Redis 6.2, or an ACL user without them; then for the life of
    this pool). Otherwise as EVALSHA, or as EVAL with its source the first time this
    server is sent it. A connection's first call goes after the library's load, and
    itself as EVAL (``first``): one round trip on any server, with the library or
    without, with functions or without (a NOSCRIPT or "function not found" round trip
    in a Redlock fan-out would eat the other nodes' time). A server that lost the
    library or its scripts says so in the reply; ``again`` says what to send then."""

    def __init__(self) -> None:
        self.functions = True
        self._loaded: set[str] = set()
        self._met = False  # whether a first call went with the library's FUNCTION LOAD
        self._opening = False  # the next call is the one that goes after the load

    def first(self, lean: bool) -> bytes:
        """What goes before the next call: the library's FUNCTION LOAD on the first call
        to this server, and again after the server closed a connection (``closed``) or
        a reply nobody waited for said the library was missing (``heard``). The call
        behind it then goes as EVAL, which runs wherever scripts do. Only on a ``lean``
        connection, which reads the load's reply as stale; elsewhere, a call that finds
        the library missing loads it (``again``)."""
        if self._met or not self.functions or not lean:
            return b""
        self._met = self._opening = True
        return function_load()

    def heard(self, reply: Any) -> None:
        """A reply nobody waited for: a stale one, or the first call's FUNCTION LOAD.
        NOSCRIPT or "function not found": the server lost its scripts or the library
        (they go with the next call again); no functions there (Redis 6.2), or not for
        this user: scripts from now on. (A load refused to a user who may call
        functions: the library may be there, loaded by another; a call finds out.)"""
        if not isinstance(reply, Exception):  # (mostly: a Redlock node's late yes)
            return
        if is_noscript(reply):
            self.forget()
        elif is_function_missing(reply):
            self._met = False
        elif refuses_functions(reply):
            self.functions = False

    def forget(self) -> None:
        """Send every script with its source again: the server answered NOSCRIPT to a
        reply nobody waited for, or a connection to it failed (it may have restarted).
        (Not the library: a call that finds it missing loads it, and a connection's
        failures, a cancelled wait's among them, are many; see ``closed``.)"""
        self._loaded.clear()

    def closed(self) -> None:
        """The server closed a connection (it may have restarted without its scripts
        and library): both go with the next call again."""
        self.forget()
        self._met = False

    def __call__(self, op: Call | Command, packed: dict[int, bytes] | None = None) -> bytes:
        """``op`` as bytes for this server; ``packed`` keeps each form once packed, for
        the other servers of a fan-out."""
        if isinstance(op, Command):
            form = _COMMAND
        elif self.functions and not self._opening:
            form = _FCALL
        elif op.script.sha in self._loaded and not self._opening:
            form = _EVALSHA
        else:
            self._opening = False
            self._loaded.add(op.script.sha)
            form = _EVAL
        if packed is None:
            return _PACKERS[form](op)
        data = packed.get(form)
        if data is None:
            data = packed[form] = _PACKERS[form](op)
        return data

    def lacks(self, error: BaseException) -> bool:
        """Whether ``again`` has something to send after ``error``."""
        return (self.functions and refuses_eval(error)) or lacking(error)

    def again(self, op: Call, error: BaseException) -> tuple[bytes, bool] | None:
        """What to send for ``op`` after its reply was ``error`` (an error reply: it did
        not run), if the error was that the server lacks its script or function; None if
        the error stands. The flag: the bytes begin with the library's FUNCTION LOAD,
        whose reply comes first and goes to ``loaded``."""
        if self.functions and refuses_eval(error):
            return fcall(op), False  # (a first call's EVAL, to a user of functions only)
        if not lacking(error):
            return None
        if self.functions and is_function_missing(error):
            return function_load() + fcall(op), True
        if refuses_functions(error):
            self.functions = False
        # (else NOSCRIPT, or a function missing for an FCALL sent before they were refused)
        self._loaded.add(op.script.sha)
        return eval_source(op), False

    def loaded(self, reply: Any) -> None:
        """The reply to the library's FUNCTION LOAD sent after "function not found":
        loaded, or there already (another process was first); any other error (NOPERM,
        out of memory) and scripts go as EVALSHA from now on."""
        if isinstance(reply, BaseException) and "already exists" not in str(reply):
            self.functions = False


class PyReader:
    """The replies of a RESP2 byte stream, as hiredis.Reader gives them (``feed``, then
    ``gets`` until NOT_ENOUGH): bulk strings as bytes, nil as None, errors as ReplyError."""

    __slots__ = ("_at", "_data")

    def __init__(self) -> None:
        self._data = bytearray()
        self._at = 0

    def feed(self, data: bytes | bytearray | memoryview, start: int = 0, length: int = -1) -> None:
        view = memoryview(data)
        self._data += view[start:] if length < 0 else view[start : start + length]

    def gets(self) -> Any:
        try:
            reply, at = self._parse(self._at)
        except IndexError:
            return NOT_ENOUGH
        if at >= 65536:  # drop what was read, now and then
            del self._data[:at]
            at = 0
        self._at = at
        return reply

    def _line(self, at: int) -> tuple[bytes, int]:
        end = self._data.find(b"\r\n", at)
        if end < 0:
            raise IndexError
        return bytes(self._data[at:end]), end + 2

    def _parse(self, at: int) -> tuple[Any, int]:
        line, at = self._line(at)
        if not line:
            raise ValueError("empty RESP line")
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest, at
        if kind == b"-":
            return ReplyError(rest.decode(errors="replace")), at
        if kind == b":":
            return int(rest), at
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None, at
            if len(self._data) < at + size + 2:
                raise IndexError
            return bytes(self._data[at : at + size]), at + size + 2
        if kind == b"*":
            count = int(rest)
            if count < 0:
                return None, at
            items = []
            for _ in range(count):
                item, at = self._parse(at)
                items.append(item)
            return items, at
        raise ValueError(f"unexpected RESP type {kind!r}")


def new_reader() -> Any:
    """A reply reader for one connection."""
    if _hiredis is None:
        return PyReader()
    return _hiredis.Reader(notEnoughData=NOT_ENOUGH, replyError=ReplyError)


# --------------------------------------------------------------------------- one read

SHOWN_BYTES = 32  # of a reply that is not RESP, shown in the error


def fed(got: int, buffer: bytearray, reader: Any) -> Any:
    """The reply that the ``got`` bytes just read into ``buffer`` complete, or NOT_ENOUGH;
    ConnectionFailed if the read found the end of the stream (0 bytes)."""
    if not got:
        raise ConnectionFailed("connection closed by server")
    try:
        reader.feed(buffer, 0, got)
    except Exception as exc:  # (the reader's own error: hiredis's ProtocolError, ValueError)
        raise _not_redis(exc, buffer[: min(got, SHOWN_BYTES)]) from exc
    return buffered(reader, buffer[: min(got, SHOWN_BYTES)])


def buffered(reader: Any, head: bytes | bytearray = b"") -> Any:
    """The next reply already in ``reader``, or NOT_ENOUGH; NotRedis if what it holds is
    not RESP (every read of a reply goes through here, bytes just read or not)."""
    try:
        return reader.gets()
    except Exception as exc:  # (the reader's own error: hiredis's ProtocolError, ValueError)
        raise _not_redis(exc, head) from exc


def _not_redis(exc: Exception, head: bytes | bytearray) -> NotRedis:
    shown = f": {bytes(head)!r}" if head else f" ({exc})"
    return NotRedis(f"the reply is not RESP{shown}")


def read_failed(exc: OSError) -> ConnectionFailed:
    """What a read that failed with ``exc`` means: the connection is gone."""
    failed = ConnectionFailed(f"error while reading: {exc}")
    failed.__cause__ = exc
    return failed


def received(recv: Callable[[], int], buffer: bytearray, reader: Any) -> Any:
    """What one non-blocking read with ``recv`` (into ``buffer``: the byte count, 0 at end
    of stream) brings: the next reply, or NOT_ENOUGH; BlockingIOError if nothing came."""
    try:
        got = recv()
    except BlockingIOError:
        raise
    except OSError as exc:
        raise read_failed(exc) from exc
    return fed(got, buffer, reader)


# --------------------------------------------------------------------------- spin, then block

DEFAULT_BUDGET = 100e-6
BUSY = 20e-6  # a yield that took longer than this: another task ran meanwhile
MISSES = 4
REST = 256
TURN = 20e-6  # asyncio: the longest a poll holds the event loop between its turns


def budget_from(setting: str | None) -> float:
    """The budget in seconds that REDLEASE_SPIN_US (``setting``) asks for."""
    if setting is None:
        return DEFAULT_BUDGET
    try:
        micros = int(setting)
    except ValueError:
        micros = -1
    if micros < 0:
        warnings.warn(
            f"REDLEASE_SPIN_US must be a whole number of microseconds >= 0, not {setting!r}; "
            f"using {DEFAULT_BUDGET * 1e6:.0f}",
            RedleaseWarning,
            stacklevel=2,
        )
        return DEFAULT_BUDGET
    return micros / 1e6


BUDGET = budget_from(os.environ.get("REDLEASE_SPIN_US"))


class SpinRecord:
    """One server's spin record, shared by its connections (races only blur a count)."""

    __slots__ = ("misses", "rest", "turned")

    def __init__(self) -> None:
        self.misses = 0  # straight polls that ended without the reply
        self.rest = 0  # reads left that sleep right away
        self.turned = 0.0  # asyncio: when a read from this server last let the loop run


def _missed(record: SpinRecord) -> Any:
    """A poll ended without the reply: after MISSES in a row, rest."""
    record.misses += 1
    if record.misses >= MISSES:
        record.misses, record.rest = 0, REST
    return NOT_ENOUGH


def resting(record: SpinRecord) -> bool:
    """Whether this read skips polling (the server's polls have missed of late)."""
    if record.rest:
        record.rest -= 1
        return True
    return False


def poll(recv: Callable[[], int], buffer: bytearray, reader: Any, record: SpinRecord) -> Any:
    """The next reply from ``reader``, polling for up to BUDGET with ``recv`` (see
    ``received``); NOT_ENOUGH when the reader should sleep in the kernel after all."""
    if resting(record):
        return NOT_ENOUGH
    return polled(recv, buffer, reader, record, time.perf_counter() + BUDGET, math.inf)


class _TurnDue:
    """What ``polled`` returns when the caller's event loop is owed a turn."""


TURN_DUE: Any = _TurnDue()


def polled(
    recv: Callable[[], int],
    buffer: bytearray,
    reader: Any,
    record: SpinRecord,
    end: float,
    turn: float,
) -> Any:
    """Poll until the reply is in (returned), until ``end`` or the CPU is wanted elsewhere
    (a miss: NOT_ENOUGH), or until ``turn`` (TURN_DUE: an asyncio poll lets its loop take a
    turn, then goes on)."""
    clock = time.perf_counter
    while True:
        try:  # (``received``'s steps: a miss, the commonest turn, costs no call)
            got = recv()
        except BlockingIOError:
            now = clock()
            if now < end:
                if now >= turn:
                    return TURN_DUE
                os.sched_yield()
                if clock() - now < BUSY:
                    continue
            return _missed(record)  # the budget is spent, or the CPU is wanted elsewhere
        except OSError as exc:
            raise read_failed(exc) from exc
        reply = fed(got, buffer, reader)
        if reply is not NOT_ENOUGH:
            record.misses = 0
            return reply
