"""The one read step of redlease's own connections, written once for every reader (the
connections' blocking and asyncio reads, the spinning poll, the stale replies' drop):
what a read of ``got`` bytes into the RESP reader yields, and what a failed or ended
read means."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._clients import ConnectionFailed, NotRedis

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
