"""The fence gate on a SQL database (``redlease.sql``), run on the caller's own connection
and inside the caller's own transaction; its rules and statements are in ``sql._gate``.
Written once, as asyncio code; ``scripts/unasync.py`` generates the blocking twin.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._async.backend import ASYNC, settled
from . import _drivers, _gate


async def afence_gate(
    conn: Any, resource: str, fence: int, *, table: str = "redlease_fences"
) -> None:
    """Let this transaction write for ``resource`` only if ``fence`` is the greatest seen.

    Records ``fence`` in the gate's table as the highest that has passed for
    ``resource``, or raises ``StaleFence`` (a ``LockLost``) if a greater one has: the
    lease that brought this fence was lost, and a newer holder has written since. Call
    it first in the transaction: its row stays locked until the transaction ends, so
    every write after it is as conditional on the fence as the gate itself: a holder
    with a smaller fence that comes meanwhile waits for this transaction to end, then is
    refused. The same fence passes again and again. A rollback undoes the record.

    ``conn``: a DB-API connection (sqlite3, psycopg 3, psycopg2; asyncio: psycopg's
    ``AsyncConnection``, aiosqlite) or a SQLAlchemy ``Connection`` / ``Session``
    (asyncio: ``AsyncConnection`` / ``AsyncSession``), on PostgreSQL or SQLite, inside a
    transaction (a gate run outside one, in autocommit, raises ``InvalidArgument``: its
    record would lock nothing). ``table``: the gate's table (``create_table`` makes it).
    On ``StaleFence`` roll the transaction back.
    """
    conn, calling = _drivers.connection(conn, want_async=ASYNC)
    name, value, where = _gate.resource(resource), _gate.fence(fence), _gate.gate_table(table)
    if _drivers.autocommitting(conn, calling):
        raise _drivers.outside_a_transaction(sent=False)
    passed = await _first(conn, calling, _gate.passing(calling, where, name, value))
    if not _drivers.in_transaction(_drivers.driver_connection(conn, calling)):
        raise _drivers.outside_a_transaction()
    if passed is None:  # a greater fence is recorded: the upsert left it as it was
        recorded = await _first(conn, calling, _gate.recorded(calling, where, name))
        raise _gate.stale(name, value, recorded)


async def afenced_update(
    conn: Any,
    table: str,
    where: Mapping[str, object],
    values: Mapping[str, object],
    fence: int,
    *,
    fence_column: str = "fence",
) -> bool:
    """Update the rows ``where`` matches (column: value, all equal) with ``values``,
    and their ``fence_column`` with ``fence``, only where that column is not greater
    than ``fence``: the check and the write in one statement, for a fence kept on the
    row itself. True if a row was updated; False if none was: a newer holder wrote it
    (the lease of this fence was lost), or no row matches. Nothing is committed."""
    conn, calling = _drivers.connection(conn, want_async=ASYNC)
    statement = _gate.update(
        calling,
        _gate.table(table),
        where,
        values,
        _gate.fence(fence),
        _gate.column(fence_column, "fence_column"),
    )
    result = await _run(conn, calling, statement)
    rows = await settled(result.fetchall())
    return len(rows) > 0


async def agated_execute(
    conn: Any,
    resource: str,
    fence: int,
    statement: Any,
    params: Any = None,
    *,
    table: str = "redlease_fences",
) -> Any:
    """Pass the gate and run ``statement``, the transaction's first write, behind it: on
    PostgreSQL through psycopg 3 or psycopg2, in one round trip.

    The same gate as ``afence_gate`` (its rules, its ``StaleFence``, its row locked until
    the transaction ends, so the writes after ``statement`` are behind it too), sent in
    one query with ``statement``: the gate's function (``create_table`` makes it beside
    the table) raises for a stale fence, so ``statement`` never runs then. Returns what
    running ``statement`` on ``conn`` returns: psycopg's cursor (a ``ClientCursor``: the
    parameters are bound in the client, as psycopg2 always binds them), psycopg2's,
    sqlite3's, SQLAlchemy's ``Result``.

    ``statement`` and ``params`` are what ``conn.execute`` takes: SQL with the driver's
    placeholders (``%s`` or ``%(name)s`` for psycopg, also its composed ``sql.SQL``;
    ``?`` for sqlite3; with ``params=None`` a ``%`` is a plain ``%``), or for SQLAlchemy
    a ``str`` or ``text()`` with ``:name`` and a mapping. On SQLite, through SQLAlchemy
    and in psycopg's pipeline mode the gate and the statement are sent one after the
    other, as ``afence_gate`` and then ``execute``.
    On ``StaleFence`` roll the transaction back.
    """
    conn, calling = _drivers.connection(conn, want_async=ASYNC)
    name, value, where = _gate.resource(resource), _gate.fence(fence), _gate.gate_table(table)
    trip = _drivers.one_trip(conn, calling, where, name, value, statement, params)
    if trip is None:
        await afence_gate(conn, name, value, table=where)
        return await conn.execute(*_gate.as_given(calling, statement, params))
    if _drivers.autocommitting(conn, calling):
        raise _drivers.outside_a_transaction(sent=False)
    cursor = _drivers.one_trip_cursor(conn, calling, want_async=ASYNC)
    try:
        await cursor.execute(*trip)
    except Exception as exc:
        refused = _drivers.refusal(exc, where, name, value)
        if refused is None:
            raise
        raise refused from exc
    return _drivers.on_statement(cursor, calling)


async def acreate_table(conn: Any, *, table: str = "redlease_fences") -> None:
    """Create the gate's table if it does not exist, and on PostgreSQL its function
    (``gated_execute``'s) if it is missing, in the caller's transaction: commit it.
    Concurrent calls wait for one another; running it again changes nothing. Their DDL,
    for a migration of your own, is in the fencing guide."""
    conn, calling = _drivers.connection(conn, want_async=ASYNC)
    for statement in _gate.create(calling, _gate.gate_table(table)):
        await _run(conn, calling, statement)


async def _run(conn: Any, calling: _gate.Calling, statement: tuple[Any, Any]) -> Any:
    """Run one of the gate's own statements, on a cursor of its own (``_drivers.own_cursor``);
    its cursor or result."""
    sql, params = statement
    cursor = _drivers.own_cursor(conn, calling, want_async=ASYNC)
    if cursor is None:
        return await conn.execute(sql, params)
    await cursor.execute(sql, params)
    return cursor


async def _first(conn: Any, calling: _gate.Calling, statement: tuple[Any, Any]) -> object:
    """The first column of the first row a query returns (None: no row)."""
    result = await _run(conn, calling, statement)
    row = await settled(result.fetchone())
    return _drivers.first_value(row)
