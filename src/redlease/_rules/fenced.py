"""The rules of the fence gate for Redis data (``FencedRedis``, ``AsyncFencedRedis``:
``_async.fenced`` and its generated twin), without I/O: which commands it takes, how
they are sent in one script (``FENCED_APPLY``), and what its reply means.

A gate keeps, per resource, the greatest fence that has passed (``P{N}:gate``, see
``_rules.keys``), and runs a list of write commands only for a fence not smaller, in one
script: nothing runs for a stale fence, and nothing else runs between the check and the
writes. The record is kept ``keep`` past the last fence that passed (a day by default):
as long as it lives, every smaller fence is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._base.errors import BackendError, InvalidArgument, StaleFence
from . import arguments as args
from .arguments import milliseconds, shown, utf8
from .flows import Flow, as_int, as_text
from .keys import FENCE_LIMIT, hash_slot
from .ops import Call
from .scripts import FENCED_APPLY, FENCED_READ

DEFAULT_KEEP = 86_400.0  # s: a day, beyond any lease's ttl and any stall worth a lease
# s: how long a reply is waited for; a later one is lost, and the commands' outcome unknown
# (the script is never sent twice: its commands need not be idempotent)
REPLY_WAIT = 5.0

# Commands whose first argument is not their one key (several keys, none, or the
# server's state): one key per command, first, is what the gate routes and checks.
REFUSED = frozenset(
    {
        "MSET",
        "MSETNX",
        "RENAME",
        "RENAMENX",
        "COPY",
        "MOVE",
        "SMOVE",
        "LMOVE",
        "BLMOVE",
        "RPOPLPUSH",
        "BRPOPLPUSH",
        "SINTERSTORE",
        "SUNIONSTORE",
        "SDIFFSTORE",
        "ZUNIONSTORE",
        "ZINTERSTORE",
        "ZDIFFSTORE",
        "ZRANGESTORE",
        "BITOP",
        "PFMERGE",
        "GEORADIUS",
        "GEORADIUSBYMEMBER",
        "GEOSEARCHSTORE",
        "SORT",
        "SORT_RO",
        "MIGRATE",
        "EVAL",
        "EVALSHA",
        "EVAL_RO",
        "EVALSHA_RO",
        "FCALL",
        "FCALL_RO",
        "FUNCTION",
        "SCRIPT",
        "MULTI",
        "EXEC",
        "DISCARD",
        "WATCH",
        "UNWATCH",
        "SELECT",
        "SWAPDB",
        "FLUSHALL",
        "FLUSHDB",
        "KEYS",
        "SCAN",
        "RANDOMKEY",
        "CONFIG",
        "DEBUG",
        "SHUTDOWN",
        "CLIENT",
        "CLUSTER",
        "PUBLISH",
        "SPUBLISH",
        "SUBSCRIBE",
        "WAIT",
        "OBJECT",
        # the key follows a subcommand
        "XGROUP",
        "XINFO",
        "MEMORY",
        "BLPOP",
        "BRPOP",
        "BZPOPMIN",
        "BZPOPMAX",
        "BLMPOP",
        "BZMPOP",
        "LMPOP",
        "ZMPOP",
        "XREAD",
        "XREADGROUP",
        # further arguments may be keys
        "SINTER",
        "SUNION",
        "SDIFF",
        "ZUNION",
        "ZINTER",
        "ZDIFF",
        "SINTERCARD",
        "ZINTERCARD",
        "LCS",
        "GEOSEARCH",
        "XAUTOCLAIM",
        "XCLAIM",
        "RESTORE",
        "DUMP",
        # no key at all: the server's state, or an echo (the first argument, taken for
        # a key, would be checked and routed as one)
        "STRALGO",
        "PUBSUB",
        "PING",
        "ECHO",
        "INFO",
        "DBSIZE",
        "TIME",
        "LASTSAVE",
        "SAVE",
        "BGSAVE",
        "BGREWRITEAOF",
        "ROLE",
        "COMMAND",
        "ACL",
        "LATENCY",
        "SLOWLOG",
        "MODULE",
        "AUTH",
        "HELLO",
        "RESET",
        "READONLY",
        "READWRITE",
        "REPLICAOF",
        "SLAVEOF",
        "FAILOVER",
        "PSUBSCRIBE",
        "SSUBSCRIBE",
        "UNSUBSCRIBE",
        "PUNSUBSCRIBE",
        "SUNSUBSCRIBE",
        "WAITAOF",
    }
)
# Commands that take several keys when given more than one argument.
_ONE_KEY_ONLY = frozenset({"DEL", "UNLINK", "EXISTS", "TOUCH", "MGET", "PFCOUNT"})
# A command's words after its key, at most: the script passes them to the server with
# Lua's unpack, which takes about 8,000 values.
MAX_WORDS = 7_000
Word = str | bytes


def resource(value: object) -> str:
    return args.resource(value)


def fence(value: object) -> int:
    return args.fence(value, FENCE_LIMIT - 1, "2**53 - 1")


def keep_ms(value: object) -> int:
    return milliseconds(value, "keep")


def _word(value: object, where: str) -> Word:
    if isinstance(value, str):
        return utf8(value, where)
    if isinstance(value, bytes):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    raise InvalidArgument(f"{where} must be str, bytes, int or float, got {shown(value)}")


def commands(
    given: object, record: str, cluster: bool
) -> tuple[tuple[Word, ...], tuple[Word, ...]]:
    """The keys and the script's words for ``given`` (a sequence of commands, each a
    tuple: its name, its key, its other arguments), checked: one key per command, first;
    never the gate's own record; on a Cluster, every key in the record's hash slot."""
    if isinstance(given, (str, bytes)) or not isinstance(given, Sequence) or not given:
        raise InvalidArgument(
            f'commands must be a non-empty list of tuples such as ("SET", key, value), '
            f"got {shown(given)}"
        )
    keys: list[Word] = [record]
    words: list[Word] = []
    slot = hash_slot(record)
    for i, command in enumerate(given):
        where = f"commands[{i}]"
        if isinstance(command, (str, bytes)) or not isinstance(command, Sequence):
            raise InvalidArgument(f"{where} must be a tuple (name, key, ...), got {shown(command)}")
        if len(command) < 2 or not isinstance(command[0], str):
            raise InvalidArgument(
                f"{where} must name a command and its key, as (name, key, ...), "
                f"got {shown(command)}"
            )
        name = command[0].upper()
        if name in REFUSED or (name in _ONE_KEY_ONLY and len(command) > 2):
            raise InvalidArgument(
                f"{where}: {name} is not taken by the gate, which runs commands of one key, "
                "given first (split a command of several keys into one per key)"
            )
        key = _word(command[1], f"{where}'s key")
        if (key.encode() if isinstance(key, str) else key) == record.encode():
            raise InvalidArgument(f"{where} writes the gate's own record {record!r}")
        if cluster and hash_slot(key) != slot:
            raise InvalidArgument(
                f"{where}'s key {key!r} is not in the hash slot of the gate's record "
                f"{record!r}: on a Cluster one script reaches one slot; give the keys "
                f"the resource's hash tag ({record[record.index('{') : record.index('}') + 1]})"
            )
        if len(command) - 2 > MAX_WORDS:
            raise InvalidArgument(
                f"{where} has {len(command) - 2} arguments after its key, more than the "
                f"{MAX_WORDS} one command may carry through the gate's script: split it"
            )
        rest = [_word(word, f"{where}'s arguments") for word in command[2:]]
        keys.append(key)
        words += [str(len(rest)), name, *rest]
    return tuple(keys), tuple(words)


def apply(
    name: str,
    record: str,
    value: int,
    keep: int,
    keys: tuple[Word, ...],
    words: tuple[Word, ...],
    timeout: float,
) -> Flow[list[Any]]:
    """Run the commands if ``value`` passes the gate: their replies, in order."""
    reply = yield Call(FENCED_APPLY, keys, (str(value), str(keep), *words), timeout)  # type: ignore[arg-type]
    status = as_int(reply[0])
    if status == 1:
        return list(reply[1:])
    if status == 0:
        raise StaleFence(name, value, as_int(reply[1]))
    failed = as_int(reply[1])
    raise BackendError(
        f"fenced commands for {name!r}: commands[{failed - 1}] "
        f"({as_text(words_name(words, failed))}) failed: {as_text(reply[2])}; the "
        f"{failed - 1} before it were applied (a script's writes are never undone)"
    )


def words_name(words: tuple[Word, ...], number: int) -> Word:
    """The name of command ``number`` (from 1) in the script's words."""
    at = 0
    for _ in range(number - 1):
        at += int(words[at]) + 2
    return words[at + 1]


def recorded(record: str, timeout: float) -> Flow[int | None]:
    reply = yield Call(FENCED_READ, (record,), (), timeout)
    return None if reply is None or reply is False else as_int(reply)
