"""Section 13: what a fence gate costs. The same work with and without the gate, in
interleaved rounds of one run: a one-row ``UPDATE`` transaction on SQLite and on
PostgreSQL (``redlease.sql.fence_gate`` first; ``gated_execute``, the gate sent with the
update; ``fenced_update``, the fence kept on the row), one ``SET`` on Redis
(``FencedRedis.apply``) against the plain command, and for reference what any statement
more costs in the PostgreSQL transaction."""

from __future__ import annotations

import itertools
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

import redlease
from redlease import sql
from redlease.tools.postgres import PostgresProcess

from ._common import Settings, describe_error
from ._pairs import Pair, measure, rows
from ._report import NA, Row

SECTION = "13. fence gates: the same write with and without the gate"
SQL_BAR = 1.3  # a gated one-row transaction takes at most this times the ungated one
REDIS_BAR = 1.5  # FencedRedis with one SET, against the SET alone
_PG_LABEL = "PostgreSQL (psycopg 3, loopback), one-row UPDATE + COMMIT"
_SQLITE_LABEL = "SQLite (sqlite3, a file), one-row UPDATE + COMMIT"
# Each gated write brings a fence greater than the last, as a new lease's would: the
# gate records it every time (a holder writing again with its fence costs the same).
_FENCES = itertools.count(1)


_UPDATE = "UPDATE accounts SET balance = balance + 1 WHERE id = 7"


def _update_pair(label: str, db: Any, bar: float | None = SQL_BAR) -> Pair:
    """A one-row UPDATE and COMMIT on ``db`` (its accounts table made), with and without
    the gate first (``db`` is closed with this pair)."""

    def plain() -> None:
        db.execute(_UPDATE)
        db.commit()

    def gated() -> None:
        sql.fence_gate(db, "account:7", next(_FENCES))
        plain()

    if bar is None:  # (PostgreSQL: gated_execute's row holds the bar, see the README)
        label = f"{label}, fence_gate first (a statement of its own; reference)"
    else:
        label = f"{label}, fence_gate first"
    return Pair(label, plain, gated, bar, db.close)


def _one_trip_pair(label: str, db: Any) -> Pair:
    """The same transaction with its UPDATE sent behind the gate by ``gated_execute``:
    on PostgreSQL the gate and the statement in one query."""

    def plain() -> None:
        db.execute(_UPDATE)
        db.commit()

    def gated() -> None:
        sql.gated_execute(db, "account:7", next(_FENCES), _UPDATE)
        db.commit()

    return Pair(f"{label}, gated_execute", plain, gated, SQL_BAR)


def _row_pair(label: str, db: Any, placeholder: str) -> Pair:
    """A one-row UPDATE of a value and COMMIT, against the same through
    ``fenced_update``: the fence kept on the row, checked inside the statement."""
    values = itertools.count(1)
    ungated = f"UPDATE accounts SET balance = {placeholder} WHERE id = 7"

    def plain() -> None:
        db.execute(ungated, (next(values),))
        db.commit()

    def gated() -> None:
        balance = {"balance": next(values)}
        if not sql.fenced_update(db, "accounts", {"id": 7}, balance, next(_FENCES)):
            raise AssertionError("fenced_update refused a fence greater than any before")
        db.commit()

    return Pair(f"{label}, fenced_update", plain, gated, SQL_BAR)


def _statement_pair(label: str, db: Any) -> Pair:
    """For reference: the same transaction with ``SELECT 1`` first, what any statement
    more costs there (the table gate is one)."""

    def plain() -> None:
        db.execute(_UPDATE)
        db.commit()

    def gated() -> None:
        db.execute("SELECT 1").fetchone()
        plain()

    return Pair(
        f"{label}, SELECT 1 first (reference: one statement more)",
        plain,
        gated,
        None,
        names=("the transaction", "with SELECT 1"),
    )


def _sqlite_pairs(path: Path) -> list[Pair]:
    db = sqlite3.connect(path)
    sql.create_table(db)
    db.execute(
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, "
        "fence INTEGER NOT NULL DEFAULT 0)"
    )
    db.execute("INSERT INTO accounts (id, balance) VALUES (7, 0)")
    db.commit()
    return [_update_pair(_SQLITE_LABEL, db), _row_pair(_SQLITE_LABEL, db, "?")]


class _Cpu:
    """CPU time of a PostgreSQL connection's two ends: its server process's (user + system,
    from ``/proc``: Linux only) and this process's."""

    def __init__(self, db: Any) -> None:
        row = db.execute("SELECT pg_backend_pid()").fetchone()
        db.commit()
        self.stat = Path(f"/proc/{row[0]}/stat")
        self.tick = os.sysconf("SC_CLK_TCK")

    def now(self) -> tuple[float, float]:
        fields = self.stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick, time.process_time()


def _cpu_rows(pair: Pair, db: Any, settings: Settings) -> list[Row]:
    """CPU per transaction at both ends, ungated and through ``gated_execute``: sides
    alternating in chunks. What the wall-clock ratio weighs on a loopback server, where a
    transaction is mostly CPU: unlike the wall clock, it does not change with the
    machine's speed of the moment."""
    label = f"{pair.label}: CPU per transaction"
    try:
        cpu = _Cpu(db)
        spent = {"plain": [0.0, 0.0], "gated": [0.0, 0.0]}
        for _ in range(settings.cpu_chunks):
            for kind in ("plain", "gated"):
                cycle = getattr(pair, kind)
                server, client = cpu.now()
                for _ in range(settings.cpu_cycles):
                    cycle()
                after = cpu.now()
                spent[kind][0] += after[0] - server
                spent[kind][1] += after[1] - client
    except Exception as exc:
        return [Row(SECTION, label, "CPU", None, f"{NA} ({describe_error(exc)})")]
    done = settings.cpu_chunks * settings.cpu_cycles
    us = {kind: [1e6 * t / done for t in ends] for kind, ends in spent.items()}
    out = []
    for kind, name in (("plain", "ungated"), ("gated", "gated")):
        server, client = us[kind]
        out.append(
            Row(
                SECTION,
                f"{label}, {name}",
                "us CPU: server + client",
                server + client,
                f"{server:.0f} + {client:.0f} us",
            )
        )
    cost = sum(us["gated"]) / sum(us["plain"])
    out.append(Row(SECTION, label, "CPU, gated / ungated", cost, f"{cost:.2f}x"))
    return out


def _postgres_pairs(dsn: str) -> tuple[list[Pair], Any]:
    """The PostgreSQL pairs, ``gated_execute``'s first, and their connection."""
    import psycopg

    db = psycopg.connect(dsn)
    sql.create_table(db)
    db.execute(
        "CREATE TABLE IF NOT EXISTS accounts (id INT PRIMARY KEY, balance INT NOT NULL, "
        "fence BIGINT NOT NULL DEFAULT 0)"
    )
    db.execute("INSERT INTO accounts (id, balance) VALUES (7, 0) ON CONFLICT DO NOTHING")
    db.commit()
    pairs = [
        _one_trip_pair(_PG_LABEL, db),
        _update_pair(_PG_LABEL, db, bar=None),
        _row_pair(_PG_LABEL, db, "%s"),
        _statement_pair(_PG_LABEL, db),
    ]
    return pairs, db


def _redis_pair(port: int) -> Pair:
    client = redis.Redis(port=port)
    gate = redlease.FencedRedis(client, "account:7")
    key = "{account:7}:balance"

    def plain() -> None:
        client.set(key, "1")

    def gated() -> None:
        gate.apply(next(_FENCES), [("SET", key, "1")])

    return Pair(
        "Redis: FencedRedis.apply([SET]) against SET", plain, gated, REDIS_BAR, client.close
    )


def run(port: int, settings: Settings, seed: int = 1) -> list[Row]:
    pairs: list[Pair] = []
    cpu: dict[int, list[Row]] = {}  # rows to follow a pair's (by its place)
    with tempfile.TemporaryDirectory(prefix="redlease-bench-gates-") as tmp:
        pairs.extend(_sqlite_pairs(Path(tmp) / "gate.db"))
        postgres = _start_postgres()
        try:
            if isinstance(postgres, str):
                pairs.append(Pair(_PG_LABEL, _nothing, _nothing, SQL_BAR, problem=postgres))
            else:
                found, db = _postgres_pairs(postgres.dsn)
                pairs.extend(found)
            pairs.append(_redis_pair(port))
            measure(pairs, settings, seed)
            if not isinstance(postgres, str) and found[0].problem is None:
                cpu[pairs.index(found[0])] = _cpu_rows(found[0], db, settings)
        finally:
            for pair in pairs:
                pair.close()
            if not isinstance(postgres, str):
                postgres.close()
    return [
        row
        for place, pair in enumerate(pairs)
        for row in (*rows(SECTION, pair), *cpu.get(place, ()))
    ]


def _nothing() -> None:
    return None


def _start_postgres() -> PostgresProcess | str:
    """A private PostgreSQL server, or why there is none (a str)."""
    try:
        return PostgresProcess().start()
    except Exception as exc:
        return f"{NA} ({describe_error(exc)})"


def note(settings: Settings) -> str:
    return (
        f"fence gates: {settings.rounds} rounds of {2 * settings.round_seconds:g} s per "
        "write, in which the ungated and the gated write take turns, one write each, each "
        "timed by itself; time ratio = ungated writes/s over gated writes/s in the same "
        "round, the median of rounds (rates: medians of rounds). The SQL rows commit each "
        "transaction; PostgreSQL is a private server on "
        "loopback with fsync off, so a round trip weighs more there than on a disk-bound "
        f"server. CPU per transaction: {settings.cpu_chunks} chunks of "
        f"{settings.cpu_cycles} transactions per side, in turn; the server's is its "
        "process's user and system time (from /proc), the client's this process's."
    )
