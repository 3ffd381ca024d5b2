"""Spin-then-block reads: one rule for both drivers (docs/design.md, "Connections and
timeouts").

A reply from a server on this host or a fast link comes back within tens of microseconds,
sooner than the kernel wakes a sleeping reader. So a read first polls its socket for up to
BUDGET seconds, giving the CPU away between polls, and gives up at once if that showed
another task wanted the CPU. After MISSES straight polls without the reply (a slow link, a
busy machine), reads from that server sleep right away for the next REST reads.
REDLEASE_SPIN_US sets the budget; 0 turns spinning off.

Stale replies. A Redlock fan-out stops reading once a majority said yes; the replies it
did not wait for are owed by their connections (both drivers count them), and read and
dropped before the next reply there. The next fan-out drops those that have arrived
while it waits for its own (``drop_arrived``), so a node that is merely a little slower
than the others costs no waiting at all. At most MAX_STALE may be owed on a connection,
beyond which its reply is waited for again (a stopped node then costs its timeout).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from typing import Any

from redis import exceptions as rx
from redis._parsers import hiredis as _hiredis_parser

from ._errors import RedleaseWarning

DEFAULT_BUDGET = 100e-6
BUSY = 20e-6  # a yield that took longer than this: another task ran meanwhile
MISSES = 4
REST = 256
MAX_STALE = 4

NOT_ENOUGH: Any = getattr(_hiredis_parser, "NOT_ENOUGH_DATA", False)


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


class Record:
    """One server's spin record, shared by its connections (races only blur a count)."""

    __slots__ = ("misses", "rest", "turned")

    def __init__(self) -> None:
        self.misses = 0  # straight polls that ended without the reply
        self.rest = 0  # reads left that sleep right away
        self.turned = 0.0  # asyncio: when a read from this server last let the loop run


def poll(recv: Callable[[], int], buffer: bytearray, reader: Any, record: Record) -> Any:
    """The next reply from ``reader``, polling for up to BUDGET with ``recv`` (a
    non-blocking read into ``buffer``: the byte count, 0 at end of stream, or
    BlockingIOError); NOT_ENOUGH when the reader should sleep in the kernel after all."""
    if record.rest:
        record.rest -= 1
        return NOT_ENOUGH
    clock = time.perf_counter
    end = clock() + BUDGET
    while True:
        try:
            got = recv()
        except BlockingIOError:
            now = clock()
            if now < end:
                os.sched_yield()
                if clock() - now < BUSY:
                    continue
            break  # the budget is spent, or the CPU is wanted elsewhere
        except OSError as exc:
            raise rx.ConnectionError(f"error while reading: {exc}") from exc
        if not got:
            raise rx.ConnectionError("connection closed by server")
        reader.feed(buffer, 0, got)
        reply = reader.gets()
        if reply is not NOT_ENOUGH:
            record.misses = 0
            return reply
    record.misses += 1
    if record.misses >= MISSES:
        record.misses, record.rest = 0, REST
    return NOT_ENOUGH


def dropped(reply: Any, forget_scripts: Callable[[], None]) -> None:
    """A stale reply, read and dropped. NOSCRIPT: the server lost its scripts (they go
    with their source again); a connection error is raised."""
    if isinstance(reply, rx.ConnectionError):
        raise reply
    if isinstance(reply, rx.NoScriptError):
        forget_scripts()


def drop_arrived(
    recv: Callable[[], int],
    buffer: bytearray,
    reader: Any,
    stale: int,
    forget_scripts: Callable[[], None],
) -> int:
    """Drop up to ``stale`` replies among those already received, never waiting (``recv``
    as for ``poll``); how many are still due. Raises rx.ConnectionError if the
    connection failed."""
    while stale:
        reply = reader.gets()
        if reply is NOT_ENOUGH:
            try:
                got = recv()
            except BlockingIOError:
                return stale
            except OSError as exc:
                raise rx.ConnectionError(f"error while reading: {exc}") from exc
            if not got:
                raise rx.ConnectionError("connection closed by server")
            reader.feed(buffer, 0, got)
            continue
        dropped(reply, forget_scripts)
        stale -= 1
    return stale
