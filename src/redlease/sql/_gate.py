"""The fence gate's rules, without I/O: the statements it runs on each SQL dialect, how a
connection of each kind is called, and its arguments. ``sql._async`` (and its generated
twin) runs them on the caller's connection, inside the caller's transaction.

The gate is a table with one row per resource: the highest fence that has passed. A
holder passes by an upsert that raises the row's fence to its own, or leaves it as it
is when it is its own already; a greater fence recorded makes the upsert change nothing,
and the gate refuses. Either way the row stays locked until the transaction ends, so a
holder with a smaller fence that comes while a greater one's transaction is open waits
for it and is then refused: the transactions that pass are never interleaved, and they
pass in the order of their fences.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._base.errors import InvalidArgument, StaleFence
from .._rules.arguments import shown, utf8

DEFAULT_TABLE = "redlease_fences"
MAX_FENCE = 2**63 - 1  # a BIGINT column's greatest value
MAX_RESOURCE = 1000  # characters: a name, not a document

# An identifier the gate writes into its statements: letters, digits and underscores,
# optionally schema-qualified. Never quoted, never taken from anything but the caller's code.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?\Z")

POSTGRESQL, SQLITE = "postgresql", "sqlite"
# How a connection runs a statement: SQLAlchemy's ``execute(text(sql), params)``, a
# DB-API connection's own ``execute`` (sqlite3, psycopg 3, aiosqlite), or a cursor's
# (psycopg2, and any other DB-API driver).
SQLALCHEMY, EXECUTE, CURSOR = "sqlalchemy", "execute", "cursor"

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

_CREATE = {
    POSTGRESQL: (
        "CREATE TABLE IF NOT EXISTS {table} ("
        "resource TEXT PRIMARY KEY, fence BIGINT NOT NULL, "
        "updated_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP)"
    ),
    SQLITE: (
        "CREATE TABLE IF NOT EXISTS {table} ("
        "resource TEXT PRIMARY KEY, fence INTEGER NOT NULL, "
        "updated_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)"
    ),
}
# The same upsert on both: a fence not smaller than the recorded one replaces it (an
# equal one too, so that the row is locked for this transaction either way), and comes
# back as a row; a greater one recorded makes it change nothing and return no row. (A row
# to fetch, not a row count: psycopg's pipeline mode knows no count before it syncs.)
_PASS = (
    "INSERT INTO {table} (resource, fence, updated_at) VALUES ({resource}, {fence}, "
    "CURRENT_TIMESTAMP) ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, "
    "updated_at = excluded.updated_at WHERE {table}.fence <= excluded.fence RETURNING fence"
)
_RECORDED = "SELECT fence FROM {table} WHERE resource = {resource}"

# PostgreSQL: the same pass as a function, for a gate sent in one query with the
# transaction's first statement (``gated_execute``): the upsert above, and a refusal
# raised as an error with its own SQLSTATE, the recorded fence in its DETAIL. (No "%"
# anywhere: the DDL goes through drivers that read "%" as a placeholder.)
STALE_SQLSTATE = "RL409"
_STALE_SAYS = "redlease gate: fence "  # how its message begins: an error of its own
_UNDEFINED_FUNCTION = "42883"
_FUNCTION = (
    "CREATE OR REPLACE FUNCTION {function}(gate_resource TEXT, gate_fence BIGINT) "
    "RETURNS BIGINT LANGUAGE plpgsql AS $redlease$ DECLARE passed BIGINT; BEGIN "
    + _PASS.replace("{resource}", "gate_resource").replace("{fence}", "gate_fence")
    + " INTO passed; IF passed IS NULL THEN "
    "SELECT fence INTO passed FROM {table} WHERE resource = gate_resource; "
    f"RAISE EXCEPTION USING ERRCODE = '{STALE_SQLSTATE}', "
    "MESSAGE = 'redlease gate: fence ' || gate_fence || ' for ' || gate_resource || "
    "' is stale: fence ' || passed || ' has passed the gate', DETAIL = passed::text; "
    "END IF; RETURN passed; END $redlease$"
)
# the gate's parameters among a caller's named ones
_RESOURCE_PARAM, _FENCE_PARAM = "redlease_resource", "redlease_fence"


@dataclass(frozen=True)
class Calling:
    """How to run statements on one connection."""

    how: str
    dialect: str
    paramstyle: str  # DB-API's name; "named" for SQLAlchemy's text()
    driver: str = ""  # the DB-API module ("psycopg", "sqlite3", ...); "" under SQLAlchemy

    def statement(self, template: str, **values: Any) -> tuple[Any, Any]:
        """``template`` with its ``{fields}`` written for this connection (an
        ``Identifier`` into the text; any other value as a parameter), and the
        parameters in the shape its driver takes."""
        names = tuple(sorted((k, v) for k, v in values.items() if isinstance(v, Identifier)))
        sql, fields = _written(template, names, self.paramstyle, self.how)
        if self.paramstyle in ("qmark", "format"):
            return sql, tuple(values[f] for f in fields)
        return sql, {f: values[f] for f in fields}


@functools.lru_cache(maxsize=512)
def _written(
    template: str, names: tuple[tuple[str, str], ...], paramstyle: str, how: str
) -> tuple[Any, tuple[str, ...]]:
    """A statement's text for one paramstyle (SQLAlchemy's ``text()`` of it), and the
    fields its parameters are, in order: the same for every call with the same template
    and identifiers, so it is written once."""
    identifiers = dict(names)
    parts: list[str] = []
    fields: list[str] = []
    for literal, field, _, _ in string.Formatter().parse(template):
        parts.append(literal)
        if field is None:
            continue
        if field in identifiers:
            parts.append(identifiers[field])
        else:
            fields.append(field)
            parts.append(
                {"qmark": "?", "format": "%s", "pyformat": f"%({field})s"}.get(
                    paramstyle, f":{field}"
                )
            )
    sql = "".join(parts)
    if how == SQLALCHEMY:
        from sqlalchemy import text  # (only a SQLAlchemy connection gets here)

        return text(sql), tuple(fields)
    return sql, tuple(fields)


class Identifier(str):
    """A table or column name, checked: written into a statement's text."""


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
    if dialect not in _CREATE:
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


def table(value: object, name: str = "table") -> Identifier:
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise InvalidArgument(
            f"{name} must be a table name (letters, digits and underscores, optionally "
            f"schema.table), got {shown(value)}"
        )
    return Identifier(value)


def gate_table(value: object) -> Identifier:
    """The gate's table: a table name whose own part leaves room for its function's
    suffix within PostgreSQL's 63 characters (a longer name would be cut, and two tables
    could share one function)."""
    checked = table(value)
    if len(checked.rsplit(".", 1)[-1]) > _LONGEST_GATE_TABLE:
        raise InvalidArgument(
            f"table must be a name of at most {_LONGEST_GATE_TABLE} characters (after any "
            f"schema): its gate function adds {_FUNCTION_SUFFIX!r}, got {shown(value)}"
        )
    return checked


def column(value: object, name: str) -> Identifier:
    if not isinstance(value, str) or not _IDENTIFIER.match(value) or "." in value:
        raise InvalidArgument(
            f"{name} must be a column name (letters, digits and underscores), got {shown(value)}"
        )
    return Identifier(value)


def resource(value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_RESOURCE:
        raise InvalidArgument(
            f"resource must be a non-empty str of at most {MAX_RESOURCE} characters "
            f"(the name of what the fence guards), got {shown(value)}"
        )
    utf8(value, "resource")
    if "\x00" in value:
        raise InvalidArgument(f"resource must be free of NUL characters, got {shown(value)}")
    return value


def fence(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_FENCE:
        raise InvalidArgument(
            f"fence must be an int from 0 to {MAX_FENCE} (a lease's fence), got {shown(value)}"
        )
    return value


# PostgreSQL: concurrent makers wait for one another (CREATE ... IF NOT EXISTS is not safe
# against a concurrent one), and the function is made only where it is missing, so that
# running create_table again, as a role that does not own the function, changes nothing.
_MAKING = "SELECT pg_advisory_xact_lock(hashtext({lock}))"
_IF_MISSING = (
    "DO $redlease_make$ BEGIN "
    "IF to_regprocedure('{function}(text, bigint)') IS NULL THEN {make}; END IF; "
    "END $redlease_make$"
)


def create(calling: Calling, table_name: Identifier) -> list[tuple[Any, Any]]:
    """The statements that make the gate: its table, and on PostgreSQL its function."""
    table_ddl = calling.statement(_CREATE[calling.dialect], table=table_name)
    if calling.dialect != POSTGRESQL:
        return [table_ddl]
    function = function_name(table_name)
    make = _IF_MISSING.replace("{make}", _FUNCTION)
    return [
        calling.statement(_MAKING, lock=f"redlease gate {table_name}"),
        table_ddl,
        calling.statement(make, table=table_name, function=function),
    ]


def as_given(calling: Calling, statement: object, params: object) -> tuple[Any, Any]:
    """A caller's own statement and parameters, as its connection's ``execute`` takes
    them (the connections ``gated_execute`` sends them to apart from the gate: SQLite's,
    SQLAlchemy's, psycopg's in pipeline mode; psycopg2 always takes the one trip)."""
    if calling.how == SQLALCHEMY and isinstance(statement, str):
        from sqlalchemy import text  # (only a SQLAlchemy connection gets here)

        statement = text(statement)
    if params is None and calling.how == SQLALCHEMY:
        params = {}
    elif params is None and calling.dialect == SQLITE:
        params = ()  # (psycopg keeps None: with parameters, "%" would be a placeholder)
    return statement, params


_FUNCTION_SUFFIX = "_pass"
_LONGEST_GATE_TABLE = 63 - len(_FUNCTION_SUFFIX)


def function_name(table_name: Identifier) -> Identifier:
    """The gate's PostgreSQL function, beside its table: ``<table>_pass``."""
    return Identifier(f"{table_name}{_FUNCTION_SUFFIX}")


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
        clash = sorted({_RESOURCE_PARAM, _FENCE_PARAM} & set(params))
        if clash:
            raise InvalidArgument(f"params must not name {', '.join(clash)}: the gate's own")
        bound = {**params, _RESOURCE_PARAM: name, _FENCE_PARAM: value}
        return f"{call}%({_RESOURCE_PARAM})s, %({_FENCE_PARAM})s); {statement}", bound
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
    if code == STALE_SQLSTATE and said.startswith(_STALE_SAYS):
        detail = getattr(diag, "message_detail", None)
        return stale(name, value, int(detail) if detail and detail.isdigit() else None)
    function = function_name(table_name)
    if code == _UNDEFINED_FUNCTION and said.startswith(f"function {function.lower()}("):
        return InvalidArgument(
            f"table={str(table_name)!r} has no gate function {function}: create_table makes "
            "it beside the table (one made by an earlier redlease has none); run "
            "redlease.sql.create_table(conn, table=...) again, or the DDL in the fencing guide"
        )
    return None


def passing(calling: Calling, table_name: Identifier, name: str, value: int) -> tuple[Any, Any]:
    return calling.statement(_PASS, table=table_name, resource=name, fence=value)


def recorded(calling: Calling, table_name: Identifier, name: str) -> tuple[Any, Any]:
    return calling.statement(_RECORDED, table=table_name, resource=name)


def stale(name: str, value: int, seen: object) -> StaleFence:
    return StaleFence(name, value, None if seen is None else int(seen))  # type: ignore[call-overload]


def update(
    calling: Calling,
    table_name: Identifier,
    where: Mapping[str, object],
    values: Mapping[str, object],
    value: int,
    fence_column: Identifier,
) -> tuple[Any, Any]:
    """``UPDATE`` of the rows ``where`` matches whose fence is not greater than ``value``."""
    if not isinstance(where, Mapping) or not where:
        raise InvalidArgument(
            f"where must be a non-empty mapping of column to value, got {shown(where)}"
        )
    if not isinstance(values, Mapping):
        raise InvalidArgument(f"values must be a mapping of column to value, got {shown(values)}")
    if any(val is None for val in where.values()):
        raise InvalidArgument(
            f'where must not compare a column with None ("= NULL" matches no row), got '
            f"{shown(where)}"
        )
    if fence_column.lower() in {str(col).lower() for col in values}:
        raise InvalidArgument(
            f"values must not set {fence_column!r}, the fence column: the update sets it"
        )
    template = _update_template(tuple(values), tuple(where), fence_column)
    named = {f"v{i}": val for i, val in enumerate(values.values())}
    named.update((f"w{i}", val) for i, val in enumerate(where.values()))
    return calling.statement(template, table=table_name, fence=value, **named)


@functools.lru_cache(maxsize=256)
def _update_template(
    sets: tuple[object, ...], matches: tuple[object, ...], fence_column: str
) -> str:
    """``update``'s statement for these columns (checked here: a name that is no column
    raises before anything is cached)."""
    assigned = [f"{column(col, 'values')} = {{v{i}}}" for i, col in enumerate(sets)]
    conditions = [f"{column(col, 'where')} = {{w{i}}}" for i, col in enumerate(matches)]
    assigned.append(f"{fence_column} = {{fence}}")
    conditions.append(f"{fence_column} <= {{fence}}")
    # RETURNING: rows to fetch, not a row count (psycopg's pipeline mode knows no count
    # before it syncs)
    return (
        f"UPDATE {{table}} SET {', '.join(assigned)} WHERE {' AND '.join(conditions)} "
        f"RETURNING {fence_column}"
    )
