"""The fence gate's rules, without I/O: the statements it runs on each SQL dialect, how
they are written for a connection's paramstyle, and its arguments. ``sql._drivers``
knows the database drivers; ``sql._async`` (and its generated twin) runs the statements
on the caller's connection, inside the caller's transaction.

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._base.errors import InvalidArgument, StaleFence
from .._rules import arguments as args
from .._rules.arguments import shown

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
DIALECTS = tuple(_CREATE)  # the dialects the gate has statements for

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
STALE_SAYS = "redlease gate: fence "  # how its message begins: an error of its own
UNDEFINED_FUNCTION = "42883"
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
RESOURCE_PARAM, FENCE_PARAM = "redlease_resource", "redlease_fence"


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
    return args.resource(value, longest=MAX_RESOURCE, nul_free=True)


def fence(value: object) -> int:
    return args.fence(value, MAX_FENCE, str(MAX_FENCE))


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
