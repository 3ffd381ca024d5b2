"""The database drivers the fence gate runs on, through each one's public API: which
kind a connection is (its driver, dialect and paramstyle), whether it is inside a
transaction, the cursors the gate's statements need, a gate sent with the caller's
statement as one query, and what a driver's error from it means. The statements
themselves are ``sql._gate``'s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._base.errors import InvalidArgument
from .._rules.arguments import shown
from ._gate import (
    CURSOR,
    DIALECTS,
    EXECUTE,
    FENCE_PARAM,
    POSTGRESQL,
    RESOURCE_PARAM,
    SQLALCHEMY,
    SQLITE,
    STALE_SAYS,
    STALE_SQLSTATE,
    UNDEFINED_FUNCTION,
    Calling,
    Identifier,
    function_name,
    stale,
)

# The driver modules known here: (dialect, paramstyle, how).
_DRIVERS = {
    "sqlite3": (SQLITE, "qmark", EXECUTE),
    "aiosqlite": (SQLITE, "qmark", EXECUTE),
    "psycopg": (POSTGRESQL, "format", EXECUTE),
    "psycopg2": (POSTGRESQL, "pyformat", CURSOR),
}
_SUPPORTED = (
    "a sqlite3, psycopg (3), psycopg2 or aiosqlite connection, or a SQLAlchemy "
    "Connection or Session (asyncio: AsyncConnection, AsyncSession) on PostgreSQL or SQLite"
)

# SQLAlchemy's drivers the gate knows, by dialect: those whose transaction state it reads
_ALCHEMY_DRIVERS = {
    POSTGRESQL: ("psycopg", "psycopg2", "asyncpg"),
    SQLITE: ("pysqlite", "aiosqlite"),
}
_SCOPED = ("scoped_session", "async_scoped_session")
SQLITE_RETURNING = (3, 35)  # the first SQLite with RETURNING, which the gate's statements use


def _known(kind: type) -> type | None:
    """The class of ``kind``'s ancestry that comes from a module the gate knows: a
    subclass of a known connection or session is one too."""
    for ancestor in kind.__mro__:
        top = ancestor.__module__.split(".")[0]
        if top == "sqlalchemy" or top in _DRIVERS:
            return ancestor
    return None


def connection(conn: object, *, want_async: bool) -> tuple[Any, Calling]:
    """The connection the gate runs on (a SQLAlchemy scoped session's current session,
    else ``conn``) and how it runs statements there; InvalidArgument if it is none of
    the kinds the gate knows, or the other flavour's (an asyncio connection given to
    the blocking gate). Nothing is sent."""
    known = _known(type(conn))
    if (
        known is not None
        and known.__module__.startswith("sqlalchemy")
        and known.__name__ in _SCOPED
    ):
        conn = conn()  # type: ignore[operator]  # the registry's current session
        known = _known(type(conn))
    named = known.__name__.lower() if known is not None else ""
    if (
        known is None
        or named.endswith(("cursor", "engine"))
        or not callable(getattr(conn, "execute", None) or getattr(conn, "cursor", None))
    ):
        kind = type(conn)
        raise InvalidArgument(f"conn must be {_SUPPORTED}; got {kind.__module__}.{kind.__name__}")
    top = known.__module__.split(".")[0]
    # asyncio connections: aiosqlite's, and the classes named so (psycopg's, SQLAlchemy's)
    is_async = top == "aiosqlite" or named.startswith(("async", "async_"))
    if is_async != want_async:
        raise InvalidArgument(
            f"conn is {'an asyncio' if is_async else 'a blocking'} connection "
            f"({type(conn).__name__}): use the {'asyncio' if is_async else 'blocking'} gate "
            f"(redlease.sql.{'a' if is_async else ''}fence_gate and its kin)"
        )
    driver = ""
    if top == "sqlalchemy":
        bind = conn.get_bind() if hasattr(conn, "get_bind") else conn
        dialect = getattr(getattr(bind, "dialect", None), "name", "")
        through = getattr(getattr(bind, "dialect", None), "driver", "")
        if dialect in _ALCHEMY_DRIVERS and through not in _ALCHEMY_DRIVERS[dialect]:
            raise InvalidArgument(
                f"conn is a SQLAlchemy connection to {dialect} through {through or 'a driver'}"
                f": the fence gate runs there through {', '.join(_ALCHEMY_DRIVERS[dialect])} "
                "(others are not tested here)"
            )
        paramstyle, how = "named", SQLALCHEMY
    else:
        dialect, paramstyle, how = _DRIVERS[top]
        driver = top
    if dialect not in DIALECTS:
        raise InvalidArgument(
            f"conn is a connection to {dialect or 'an unknown database'}: the fence gate "
            "runs on PostgreSQL and SQLite (others are not tested here)"
        )
    if dialect == SQLITE:
        import sqlite3  # (pysqlite and aiosqlite run on it)

        if sqlite3.sqlite_version_info < SQLITE_RETURNING:
            raise InvalidArgument(
                f"conn is a connection to SQLite {sqlite3.sqlite_version}: the fence gate "
                "needs SQLite 3.35 or later (its statements use RETURNING)"
            )
    return conn, Calling(how, dialect, paramstyle, driver)


def driver_connection(conn: Any, calling: Calling) -> Any:
    """The driver's own connection under ``conn`` (SQLAlchemy's, once it has run a
    statement: no I/O then), through public attributes only."""
    if calling.how != SQLALCHEMY:
        return conn
    conn = getattr(conn, "sync_session", None) or conn  # an AsyncSession's own Session
    conn = getattr(conn, "sync_connection", None) or conn  # an AsyncConnection's own
    if callable(conn.connection):  # a Session: the Connection of its transaction
        conn = conn.connection()
    return conn.connection.driver_connection


def in_transaction(driver: Any) -> bool:
    """Whether the driver's connection is inside a transaction (the gate's row lock then
    lasts until it ends), by what each driver says of itself."""
    if hasattr(driver, "is_in_transaction"):  # asyncpg
        return bool(driver.is_in_transaction())
    if hasattr(driver, "in_transaction"):  # sqlite3, aiosqlite
        return bool(driver.in_transaction)
    if hasattr(driver, "get_transaction_status"):  # psycopg2: 0 is IDLE
        return int(driver.get_transaction_status()) != 0
    return str(driver.info.transaction_status.name) != "IDLE"  # psycopg 3


def autocommitting(conn: Any, calling: Calling) -> bool:
    """Whether a DB-API connection would commit the gate's statement by itself (autocommit,
    no transaction open), read before anything is sent. (A SQLAlchemy connection's is
    read from its driver after the gate's statement: before, it may have none.)"""
    if calling.how == SQLALCHEMY or in_transaction(conn):
        return False
    if calling.dialect == SQLITE:
        mode = getattr(conn, "autocommit", None)  # sqlite3 from Python 3.12: True, False or -1
        if isinstance(mode, bool):
            return mode
        return conn.isolation_level is None
    return bool(conn.autocommit)


def outside_a_transaction(*, sent: bool = True) -> InvalidArgument:
    """The refusal of a gate outside a transaction: after its statement ran (``sent``), or
    before anything was sent."""
    if sent:
        what = "ran the gate outside a transaction (autocommit): its record was committed at once"
    else:
        what = (
            "is outside a transaction (autocommit; nothing was sent): the gate's record "
            "would be committed at once"
        )
    return InvalidArgument(
        f"conn {what} and locks nothing for the writes after it; run the gate and the "
        "writes in one transaction (autocommit off, or psycopg's conn.transaction(), or BEGIN)"
    )


def first_value(row: Any) -> object:
    """A row's first column, whatever shape the driver gives rows in (a tuple, a dict:
    psycopg's dict_row, psycopg2's RealDictCursor; SQLAlchemy's Row)."""
    if row is None:
        return None
    if isinstance(row, Mapping):
        return next(iter(row.values()))
    return row[0]


def one_trip(
    conn: Any,
    calling: Calling,
    table_name: Identifier,
    name: str,
    value: int,
    statement: object,
    params: object,
) -> tuple[str, Any] | None:
    """The gate's function and ``statement`` as one query, with its parameters, for a
    driver that binds parameters in the client and so sends several statements as one
    (psycopg 3 through a ``ClientCursor``, psycopg2); None for the others, where the gate
    and the statement go one after the other: other drivers, and psycopg in pipeline mode
    (whose statements travel together anyway, one each)."""
    if calling.driver not in ("psycopg", "psycopg2"):
        return None
    if calling.driver == "psycopg" and conn.pgconn.pipeline_status:
        return None
    if hasattr(statement, "as_string"):  # the driver's composed SQL (psycopg.sql, psycopg2.sql)
        statement = statement.as_string(conn)
    if isinstance(statement, bytes):
        statement = statement.decode()
    if not isinstance(statement, str) or not statement.strip():
        raise InvalidArgument(
            f"statement must be the SQL of one statement (a non-empty str, with "
            f"{calling.driver}'s placeholders: %s or %(name)s), got {shown(statement)}"
        )
    call = f"SELECT {function_name(table_name)}("
    if params is None:  # the statement's own "%" is then no placeholder
        return f"{call}%s, %s); {statement.replace('%', '%%')}", (name, value)
    if isinstance(params, Mapping):
        clash = sorted({RESOURCE_PARAM, FENCE_PARAM} & set(params))
        if clash:
            raise InvalidArgument(f"params must not name {', '.join(clash)}: the gate's own")
        bound = {**params, RESOURCE_PARAM: name, FENCE_PARAM: value}
        return f"{call}%({RESOURCE_PARAM})s, %({FENCE_PARAM})s); {statement}", bound
    if isinstance(params, (str, bytes)) or not isinstance(params, Sequence):
        raise InvalidArgument(
            f"params must be a sequence, a mapping or None (the statement's parameters), "
            f"got {shown(params)}"
        )
    return f"{call}%s, %s); {statement}", (name, value, *params)


def own_cursor(conn: Any, calling: Calling, *, want_async: bool) -> Any:
    """A cursor for the gate's own statements, whatever the connection's own cursors are
    (psycopg: tuple rows, server-side binding); None: run them with ``conn.execute``."""
    if calling.driver == "psycopg2":
        return conn.cursor()
    if calling.driver != "psycopg":
        return None
    import psycopg  # (only a psycopg connection gets here)
    from psycopg.rows import tuple_row

    cursor = psycopg.AsyncCursor if want_async else psycopg.Cursor
    return cursor(conn, row_factory=tuple_row)


def one_trip_cursor(conn: Any, calling: Calling, *, want_async: bool) -> Any:
    """A cursor of ``conn`` that binds parameters in the client (psycopg2's always do)."""
    if calling.driver == "psycopg2":
        return conn.cursor()
    import psycopg  # (only a psycopg connection gets here)

    return psycopg.AsyncClientCursor(conn) if want_async else psycopg.ClientCursor(conn)


def on_statement(cursor: Any, calling: Calling) -> Any:
    """``cursor`` moved from the gate's result to the statement's (psycopg2 keeps only
    the last result of a query)."""
    if calling.driver == "psycopg":
        cursor.nextset()
    return cursor


def refusal(exc: BaseException, table_name: Identifier, name: str, value: int) -> Exception | None:
    """What a driver's error from a one-trip gate means to the caller: ``StaleFence``
    (the function refused the fence), ``InvalidArgument`` (the table has no function:
    made before there was one), or None: an error of the statement's own."""
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    diag = getattr(exc, "diag", None)
    said = str(getattr(diag, "message_primary", None) or "").lower()
    if code == STALE_SQLSTATE and said.startswith(STALE_SAYS):
        detail = getattr(diag, "message_detail", None)
        return stale(name, value, int(detail) if detail and detail.isdigit() else None)
    function = function_name(table_name)
    if code == UNDEFINED_FUNCTION and said.startswith(f"function {function.lower()}("):
        return InvalidArgument(
            f"table={str(table_name)!r} has no gate function {function}: create_table makes "
            "it beside the table (one made by an earlier redlease has none); run "
            "redlease.sql.create_table(conn, table=...) again, or the DDL in the fencing guide"
        )
    return None
