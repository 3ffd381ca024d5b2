"""The resource the workers protect, on its own server (lock-server faults do not touch it).

Two counters, both updated by a non-atomic read-modify-write under the lock:

- the *unfenced* counter: plain GET and SET, trusting the lock alone;
- the *fenced* counter: every read and write carries the holder's fencing token. The
  resource records the highest token seen on first access (a read counts) and refuses any
  lower one, atomically in a Lua script, as Kleppmann's storage service does.

The fenced write also says whether it was *stale*: accepted although the counter changed
since this writer read it (a lost update that fencing should have prevented). Every
accepted token is appended to a log so the checker can verify they never go down.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

UNFENCED = "res:unfenced"
FENCED = "res:fenced"
HIGHEST = "res:highest-fence"
ACCEPTED_LOG = "res:accepted-fences"
REJECTED = "res:rejected"
STALE_ACCEPTED = "res:stale-accepted"
KEYS = (UNFENCED, FENCED, HIGHEST, ACCEPTED_LOG, REJECTED, STALE_ACCEPTED)

# KEYS[1] highest fence, KEYS[2] fenced counter, KEYS[3] accepted log, KEYS[4] rejections
# ARGV[1] fence
# Returns {1, counter} when the token is accepted, {0, highest} when it is refused.
FENCED_READ = """
local high = tonumber(redis.call('GET', KEYS[1]) or '-1')
local fence = tonumber(ARGV[1])
if fence < high then
  redis.call('INCR', KEYS[4])
  return {0, high}
end
redis.call('SET', KEYS[1], fence)
redis.call('RPUSH', KEYS[3], fence)
return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
"""

# KEYS[1] highest fence, KEYS[2] fenced counter, KEYS[3] accepted log, KEYS[4] rejections,
# KEYS[5] stale writes accepted
# ARGV[1] fence, ARGV[2] the value this writer read, ARGV[3] the value to write
# Returns 1 when written, 0 when refused.
FENCED_WRITE = """
local high = tonumber(redis.call('GET', KEYS[1]) or '-1')
local fence = tonumber(ARGV[1])
if fence < high then
  redis.call('INCR', KEYS[4])
  return 0
end
redis.call('SET', KEYS[1], fence)
redis.call('RPUSH', KEYS[3], fence)
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[2]) then
  redis.call('INCR', KEYS[5])
end
redis.call('SET', KEYS[2], ARGV[3])
return 1
"""


class Resource:
    """Client side of the resource, for one worker."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._read = client.register_script(FENCED_READ)
        self._write = client.register_script(FENCED_WRITE)

    def read(self) -> int:
        return int(self.client.get(UNFENCED) or 0)

    def write(self, value: int) -> None:
        self.client.set(UNFENCED, value)

    def fenced_read(self, fence: int) -> int | None:
        """The fenced counter, or None if the token was refused."""
        ok, value = self._read(keys=[HIGHEST, FENCED, ACCEPTED_LOG, REJECTED], args=[fence])
        return int(value) if ok else None

    def fenced_write(self, fence: int, read: int, value: int) -> bool:
        keys = [HIGHEST, FENCED, ACCEPTED_LOG, REJECTED, STALE_ACCEPTED]
        return bool(self._write(keys=keys, args=[fence, read, value]))


@dataclass(frozen=True)
class ResourceState:
    unfenced: int
    fenced: int
    accepted_fences: list[int]
    rejected: int
    stale_accepted: int

    @property
    def fence_regressions(self) -> int:
        """Accepted tokens that went down (the resource's own rule, checked from outside)."""
        log = self.accepted_fences
        return sum(1 for a, b in itertools.pairwise(log) if b < a)


def reset(client: Any) -> None:
    client.delete(*KEYS)


def state(client: Any) -> ResourceState:
    return ResourceState(
        unfenced=int(client.get(UNFENCED) or 0),
        fenced=int(client.get(FENCED) or 0),
        accepted_fences=[int(x) for x in client.lrange(ACCEPTED_LOG, 0, -1)],
        rejected=int(client.get(REJECTED) or 0),
        stale_accepted=int(client.get(STALE_ACCEPTED) or 0),
    )


# -- rows 20: the fence gates -----------------------------------------------------------

GATED = "chaos-gated"  # the resource both gates guard
GATED_KEY = "{chaos-gated}:counter"  # on the resource server, in the gate record's slot
GATED_TABLE = "chaos_gated"  # in PostgreSQL: one row, id 1, the counter n
GATES = ("sql", "redis")


class Gates:
    """Worker side of rows 20: a counter in PostgreSQL behind ``redlease.sql.fence_gate``
    and one on the resource server behind ``FencedRedis``. Each section reads both and
    writes both back plus one, every read and write through its gate (a read passes it
    too, so that a holder with an older fence that read before cannot write after).
    ``counts``: per gate, [writes accepted, sections stopped at the gate]."""

    def __init__(self, client: Any, dsn: str) -> None:
        import psycopg

        import redlease

        self.redis = redlease.FencedRedis(client, GATED)
        self.db = psycopg.connect(dsn)
        self.counts = {gate: [0, 0] for gate in GATES}

    def read(self, fence: int) -> dict[str, int | None]:
        """Each counter, or None where the gate refused this fence (counted as stopped)."""
        return {
            "sql": self._stopped("sql", lambda: self._sql(fence, None)),
            "redis": self._stopped(
                "redis", lambda: int(self.redis.apply(fence, [("GET", GATED_KEY)])[0] or 0)
            ),
        }

    def write(self, fence: int, seen: dict[str, int | None]) -> None:
        """Each counter read back plus one, where its read passed the gate."""
        sql_seen, redis_seen = seen["sql"], seen["redis"]
        if sql_seen is not None:
            self._accepted("sql", lambda: self._sql(fence, sql_seen + 1))
        if redis_seen is not None:
            self._accepted(
                "redis", lambda: self.redis.apply(fence, [("SET", GATED_KEY, redis_seen + 1)])
            )

    def _accepted(self, gate: str, step: Callable[[], object]) -> None:
        if self._stopped(gate, step) is not None:
            self.counts[gate][0] += 1

    def _stopped(self, gate: str, step: Callable[[], object]) -> Any:
        from ..._base.errors import StaleFence

        try:
            result = step()
        except StaleFence:
            self.counts[gate][1] += 1
            return None
        return result  # (never None: a read gives an int, a write its reply)

    def _sql(self, fence: int, value: int | None) -> int:
        """One transaction: the gate, then the read (value None) or the write."""
        from ... import sql

        try:
            sql.fence_gate(self.db, GATED, fence)
            if value is None:
                row = self.db.execute(f"SELECT n FROM {GATED_TABLE} WHERE id = 1").fetchone()
            else:
                row = self.db.execute(
                    f"UPDATE {GATED_TABLE} SET n = %s WHERE id = 1 RETURNING n", (value,)
                ).fetchone()
            self.db.commit()
        except BaseException:
            self.db.rollback()
            raise
        return int(row[0]) if row is not None else 0

    def close(self) -> None:
        self.db.close()


def reset_gates(client: Any, dsn: str) -> None:
    import psycopg

    from ... import sql
    from ..._rules.keys import gate_key

    client.delete(GATED_KEY, gate_key(GATED))
    with psycopg.connect(dsn) as db:
        db.execute(f"DROP TABLE IF EXISTS {GATED_TABLE}, redlease_fences")
        db.execute(f"CREATE TABLE {GATED_TABLE} (id INT PRIMARY KEY, n BIGINT NOT NULL)")
        db.execute(f"INSERT INTO {GATED_TABLE} VALUES (1, 0)")
        sql.create_table(db)


def gate_state(client: Any, dsn: str) -> dict[str, int]:
    """Each gated counter's final value."""
    import psycopg

    with psycopg.connect(dsn) as db:
        row = db.execute(f"SELECT n FROM {GATED_TABLE} WHERE id = 1").fetchone()
    return {"sql": int(row[0]) if row else 0, "redis": int(client.get(GATED_KEY) or 0)}
