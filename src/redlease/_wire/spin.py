"""Spin-then-block reads: one rule for both drivers (docs/design.md, "Connections and
timeouts").

A reply from a server on this host or a fast link comes back within tens of microseconds,
sooner than the kernel wakes a sleeping reader. So a read first polls its socket for up to
BUDGET seconds, giving the CPU away between polls, and gives up at once if that showed
another task wanted the CPU. After MISSES straight polls without the reply (a slow link, a
busy machine), reads from that server sleep right away for the next REST reads.
REDLEASE_SPIN_US sets the budget; 0 turns spinning off.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

from .._base.errors import RedleaseWarning
from .reading import fed, read_failed
from .resp import NOT_ENOUGH

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


class Record:
    """One server's spin record, shared by its connections (races only blur a count)."""

    __slots__ = ("misses", "rest", "turned")

    def __init__(self) -> None:
        self.misses = 0  # straight polls that ended without the reply
        self.rest = 0  # reads left that sleep right away
        self.turned = 0.0  # asyncio: when a read from this server last let the loop run


def _missed(record: Record) -> Any:
    """A poll ended without the reply: after MISSES in a row, rest."""
    record.misses += 1
    if record.misses >= MISSES:
        record.misses, record.rest = 0, REST
    return NOT_ENOUGH


def resting(record: Record) -> bool:
    """Whether this read skips polling (the server's polls have missed of late)."""
    if record.rest:
        record.rest -= 1
        return True
    return False


def poll(recv: Callable[[], int], buffer: bytearray, reader: Any, record: Record) -> Any:
    """The next reply from ``reader``, polling for up to BUDGET with ``recv`` (see
    ``_wire.reading.received``); NOT_ENOUGH when the reader should sleep in the kernel after all."""
    if resting(record):
        return NOT_ENOUGH
    return polled(recv, buffer, reader, record, time.perf_counter() + BUDGET, math.inf)


class _TurnDue:
    """What ``polled`` returns when the caller's event loop is owed a turn."""


TURN_DUE: Any = _TurnDue()


def polled(
    recv: Callable[[], int], buffer: bytearray, reader: Any, record: Record, end: float, turn: float
) -> Any:
    """Poll until the reply is in (returned), until ``end`` or the CPU is wanted elsewhere
    (a miss: NOT_ENOUGH), or until ``turn`` (TURN_DUE: an asyncio poll lets its loop take a
    turn, then goes on)."""
    clock = time.perf_counter
    while True:
        try:  # (_wire.reading.received's steps: a miss, the commonest turn, costs no call)
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
