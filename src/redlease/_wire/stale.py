"""Stale replies: replies a connection owes that nobody waits for any more.

A connection's first call may be sent after the library's FUNCTION LOAD, whose reply
is stale from the start (see ``resp.Wire.first``). A Redlock fan-out stops reading once
a majority said yes; the replies it did not wait for are owed by their connections
(both drivers count them in ``stale``), and read and dropped before the next reply
there. The next fan-out drops those that have arrived
while it waits for its own (``drop_arrived``), so a node that is merely a little slower
than the others costs no waiting at all. At most MAX_STALE may be owed on a connection,
beyond which its reply is waited for again (a stopped node then costs its timeout).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .resp import NOT_ENOUGH, buffered, received

MAX_STALE = 4


def dropped(reply: Any, heard: Callable[[Any], None]) -> None:
    """A stale reply, read and dropped, once its wire has heard it (``Wire.heard``)."""
    heard(reply)


def drop_arrived(
    recv: Callable[[], int],
    buffer: bytearray,
    reader: Any,
    stale: int,
    heard: Callable[[Any], None],
) -> int:
    """Drop up to ``stale`` replies among those already received, never waiting (``recv``
    as for ``received``); how many are still due. Raises ConnectionFailed if the
    connection failed."""
    while stale:
        reply = buffered(reader)
        if reply is NOT_ENOUGH:
            try:
                reply = received(recv, buffer, reader)
            except BlockingIOError:
                return stale
            if reply is NOT_ENOUGH:
                continue
        dropped(reply, heard)
        stale -= 1
    return stale
