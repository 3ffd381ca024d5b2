"""RESP, the wire format, for both drivers: encoding the core's operations, and reading
replies from the sockets redlease owns.

The lock's commands are short lists of str; packing them here (in C when hiredis is
installed) skips a client's general-purpose argument handling on the hot path. Replies
are parsed by ``hiredis.Reader`` when installed, else by ``PyReader`` (RESP2, which is
all redlease's own connections speak). Either returns an error reply as a
``ReplyError`` (not raised) and ``NOT_ENOUGH`` while a reply is incomplete.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._clients.errors import ReplyError
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


def command(args: tuple[str, ...]) -> bytes:
    return pack(args)


_COMMAND, _EVALSHA, _EVAL = 0, 1, 2


def _command_bytes(op: Command) -> bytes:
    return command(op.args)


_PACKERS: tuple[Callable[[Any], bytes], ...] = (_command_bytes, evalsha, eval_source)


class Wire:
    """How ops go on the wire to one server, which remembers the scripts it was sent.

    A script goes as EVALSHA, or as EVAL with its source the first time this server is
    sent it: no NOSCRIPT round trip, which in a Redlock fan-out would eat the other
    nodes' time. (A server that lost its scripts answers NOSCRIPT later; the driver
    falls back to EVAL then.)"""

    def __init__(self) -> None:
        self._loaded: set[str] = set()

    def forget(self) -> None:
        """Send every script with its source again: the server answered NOSCRIPT to a
        reply nobody waited for, or a connection to it failed (it may have restarted)."""
        self._loaded.clear()

    def __call__(self, op: Call | Command, packed: dict[int, bytes] | None = None) -> bytes:
        """``op`` as bytes for this server; ``packed`` keeps each form once packed, for
        the other servers of a fan-out."""
        if isinstance(op, Command):
            form = _COMMAND
        elif op.script.sha in self._loaded:
            form = _EVALSHA
        else:
            self._loaded.add(op.script.sha)
            form = _EVAL
        if packed is None:
            return _PACKERS[form](op)
        data = packed.get(form)
        if data is None:
            data = packed[form] = _PACKERS[form](op)
        return data


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
