"""Section 7: new TCP connections that timed-out acquires cost, per 1,000.

This process holds the lock (a long ttl); a second client then asks for it N times with
a short timeout, each ask timing out. The server's ``total_connections_received`` before
and after, scaled to 1,000 asks, is the figure. A connection per timed-out wait exhausts
a client host's ephemeral ports at a few hundred per second on a real network (each
closed connection sits in TIME_WAIT for a minute).
"""

from __future__ import annotations

from collections.abc import Sequence

from ._common import Settings, describe_error
from ._locks import KINDS, SyncLock, client, make_lock
from ._report import NA, Row, verdict

SECTION = "7. connections: new TCP connections per 1,000 timed-out acquires"
HOLD_TTL = 120.0
ASK_TIMEOUT = 0.005
HANDFUL = 5  # the bar, per 1,000 asks


def _received(port: int) -> int:
    with client(port) as admin:
        return int(admin.info("stats")["total_connections_received"])


def measure_one(port: int, kind: str, asks: int) -> float:
    holder_client, asker_client = client(port), client(port)
    name = f"bench:c:{kind}"
    try:
        holder = make_lock(kind, holder_client, name, HOLD_TTL)
        held = holder.acquire(timeout=5.0)
        asker = make_lock(kind, asker_client, name, HOLD_TTL)
        try:
            with_timeouts(asker, 3)  # the asker's first connections are not the figure
            before = _received(port)
            with_timeouts(asker, asks)
            opened = _received(port) - before - 1  # the count's own connection
        finally:
            holder.release(held)
    finally:
        holder_client.close()
        asker_client.close()
    return opened * 1000.0 / asks


def with_timeouts(lock: SyncLock, asks: int) -> None:
    for _ in range(asks):
        try:
            lock.acquire(timeout=ASK_TIMEOUT)
        except TimeoutError:
            continue
        raise RuntimeError("the lock was acquired while held")


# python-redis-lock waits whole seconds at the least (its timeout is an int): a hundred
# timed-out asks would take minutes. Its waits use the client's own pool, as redis-py's.
CONTENDERS = ("redlease", "redis-py")


def run(port: int, settings: Settings, kinds: Sequence[str] = CONTENDERS) -> list[Row]:
    asks = settings.timed_out_asks
    figure = f"new connections per 1,000 ({asks} asks, timeout {ASK_TIMEOUT * 1000:g} ms)"
    out = []
    for kind in kinds:
        mine = kind == "redlease"
        try:
            per_1000 = measure_one(port, kind, asks)
        except Exception as exc:
            shown = f"error: {describe_error(exc)}"
            out.append(Row(SECTION, KINDS[kind], figure, None, shown, verdict=NA if mine else ""))
            continue
        out.append(
            Row(
                SECTION,
                KINDS[kind],
                figure,
                per_1000,
                f"{per_1000:.0f}",
                bar=f"<= {HANDFUL}" if mine else "",
                verdict=verdict(per_1000 <= HANDFUL) if mine else "",
            )
        )
    return out
