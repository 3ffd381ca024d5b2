"""The fence gates under the conditions production brings: many holders contending, some
paused past their lease; a server that closes idle connections, kills them, restarts with
and without its data. Real servers throughout (Redis/Valkey, PostgreSQL, SQLite)."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

import families
import redlease
from redlease import sql
from redlease.tools import servers
from redlease.tools.postgres import PostgresProcess

HOLDERS = 8
SECTIONS = 6  # per holder
TTL = 0.4
PAUSED = {2, 5}  # sections (by index, per holder) that stall past the lease


@contextlib.contextmanager
def _server(binary: servers.ServerBinary, **options: Any) -> Iterator[servers.ServerProcess]:
    proc = servers.ServerProcess(binary, **options).start()
    try:
        yield proc
    finally:
        proc.stop()


def _contend(
    lock_port: int, name: str, read: Callable[[int], Any], write: Callable[[int, Any], None]
) -> tuple[int, int]:
    """HOLDERS threads, each taking the lock SECTIONS times, reading through the gate,
    stalling past the lease in some sections, then writing through the gate. Returns
    (writes accepted, writes refused as stale)."""
    accepted, stale, errors = [0], [0], []
    counting = threading.Lock()

    def holder(index: int) -> None:
        client = families.client(port=lock_port)
        try:
            lock = redlease.Lock(client, name, ttl=TTL)
            for section in range(SECTIONS):
                with contextlib.ExitStack() as stack:
                    lease = lock.acquire(timeout=60)
                    stack.callback(_release_quietly, lease)
                    try:
                        seen = read(lease.fence)
                        if section in PAUSED and index % 2 == 0:
                            time.sleep(TTL * 1.5)  # stalled: its lease runs out meanwhile
                        write(lease.fence, seen)
                    except redlease.StaleFence:
                        with counting:
                            stale[0] += 1
                        continue
                    with counting:
                        accepted[0] += 1
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=holder, args=(i,)) for i in range(HOLDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert errors == []
    return accepted[0], stale[0]


def _gated(db: Any, fence: int, statement: str, **table: str) -> Any:
    """One transaction on ``db``: the gate for "counter", then ``statement``; its first
    column (rolled back on any error, StaleFence included)."""
    try:
        sql.fence_gate(db, "counter", fence, **table)
        row = db.execute(statement).fetchone()
        db.commit()
    except BaseException:
        db.rollback()
        raise
    return None if row is None else row[0]


def _release_quietly(lease: redlease.Lease) -> None:
    with contextlib.suppress(redlease.LockLost):
        lease.release()


def test_no_update_is_lost_through_fenced_redis_while_holders_stall(
    server: servers.ServerProcess, binary: servers.ServerBinary, name: str
) -> None:
    """A read-modify-write of a counter on a second server, the read and the write both
    through the gate: every stale write is refused, so the counter is exactly the number
    of writes accepted. (Taken out, the gate lets stalled holders overwrite newer ones.)"""
    with _server(binary) as data_server:
        data = families.client(port=data_server.port)
        gate = redlease.FencedRedis(data, name)

        def read(fence: int) -> int:
            return int(gate.apply(fence, [("GET", "counter")])[0] or 0)

        def write(fence: int, seen: int) -> None:
            gate.apply(fence, [("SET", "counter", seen + 1)])

        accepted, stale = _contend(server.port, name, read, write)
        assert stale > 0  # the stalls happened, and the gate stopped them
        assert int(data.get("counter") or 0) == accepted
        data.close()


def test_no_update_is_lost_through_the_sql_gate_while_holders_stall(
    server: servers.ServerProcess, name: str, postgres: PostgresProcess
) -> None:
    table = "gate_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres.dsn) as setup:
        sql.create_table(setup, table=table)
        setup.execute(f"CREATE TABLE c_{table} (id INT PRIMARY KEY, n INT NOT NULL)")
        setup.execute(f"INSERT INTO c_{table} VALUES (1, 0)")
    local, opened = threading.local(), []

    def conn() -> psycopg.Connection[Any]:
        if not hasattr(local, "conn"):
            local.conn = psycopg.connect(postgres.dsn)
            opened.append(local.conn)
        made: psycopg.Connection[Any] = local.conn
        return made

    def transaction(fence: int, statement: str) -> Any:
        return _gated(conn(), fence, statement, table=table)

    def read(fence: int) -> int:
        return int(transaction(fence, f"SELECT n FROM c_{table} WHERE id = 1"))

    def write(fence: int, seen: int) -> None:
        transaction(fence, f"UPDATE c_{table} SET n = {seen + 1} WHERE id = 1 RETURNING n")

    try:
        accepted, stale = _contend(server.port, name, read, write)
    finally:
        for made in opened:
            made.close()
    assert stale > 0
    with psycopg.connect(postgres.dsn) as check:
        (final,) = check.execute(f"SELECT n FROM c_{table} WHERE id = 1").fetchone() or (None,)
    assert final == accepted


def test_fenced_redis_on_a_server_that_closes_idle_connections(
    binary: servers.ServerBinary, name: str
) -> None:
    with _server(binary, extra_args=("--timeout", "1")) as proc:
        client = families.client(port=proc.port)
        gate = redlease.FencedRedis(client, name)
        gate.apply(3, [("SET", "k", "a")])
        time.sleep(2.5)  # the server has closed every connection by now
        gate.apply(4, [("SET", "k", "b")])
        with pytest.raises(redlease.StaleFence):
            gate.apply(3, [("SET", "k", "c")])
        assert client.get("k") == b"b"
        client.close()


def test_fenced_redis_after_its_connections_are_killed(
    binary: servers.ServerBinary, name: str
) -> None:
    with _server(binary) as proc:
        client = families.client(port=proc.port)
        gate = redlease.FencedRedis(client, name)
        gate.apply(3, [("SET", "k", "a")])
        with families.client(port=proc.port) as admin:
            own = int(admin.client_id())
            for entry in admin.client_list():
                if int(entry["id"]) != own:
                    admin.client_kill_filter(_id=entry["id"])
        assert gate.apply(4, [("INCR", "n")]) == [1]
        with pytest.raises(redlease.StaleFence):
            gate.apply(3, [("INCR", "n")])
        assert client.get("n") == b"1"
        client.close()


@pytest.mark.parametrize("persisted", [True, False], ids=["with its data", "empty"])
def test_fenced_redis_across_a_restart(
    binary: servers.ServerBinary, name: str, persisted: bool
) -> None:
    """Restarted with its data, the record still refuses older fences; restarted empty,
    it is gone with the data it guarded, and the next fence passes (as documented)."""
    with _server(binary, appendfsync_always=persisted) as proc:
        client = families.client(port=proc.port)
        gate = redlease.FencedRedis(client, name)
        gate.apply(9, [("SET", "k", "nine")])
        proc.restart()
        if persisted:
            with pytest.raises(redlease.StaleFence):
                gate.apply(8, [("SET", "k", "eight")])
            assert client.get("k") == b"nine"
        else:
            assert gate.recorded() is None
            gate.apply(8, [("SET", "k", "eight")])
        client.close()


def test_the_sql_gate_on_sqlite_with_many_writers(
    tmp_path: Path, name: str, r: redis.Redis
) -> None:
    """SQLite locks the whole file for a writer: the gate still serialises holders and
    refuses the stale ones; the counter is the number of writes accepted."""
    path = tmp_path / "gate.db"
    with contextlib.closing(sqlite3.connect(path)) as setup:
        sql.create_table(setup)
        setup.execute("CREATE TABLE c (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        setup.execute("INSERT INTO c VALUES (1, 0)")
        setup.commit()
    port = r.connection_pool.connection_kwargs["port"]

    def transaction(fence: int, statement: str) -> Any:
        with contextlib.closing(sqlite3.connect(path, timeout=60)) as db:
            return _gated(db, fence, statement)

    def read(fence: int) -> int:
        return int(transaction(fence, "SELECT n FROM c WHERE id = 1"))

    def write(fence: int, seen: int) -> None:
        transaction(fence, f"UPDATE c SET n = {seen + 1} WHERE id = 1 RETURNING n")

    accepted, stale = _contend(port, name, read, write)
    assert stale > 0
    with contextlib.closing(sqlite3.connect(path)) as check:
        assert check.execute("SELECT n FROM c WHERE id = 1").fetchone() == (accepted,)
