"""The ACL rule a redlease user needs, written once: ``acl_rule()`` gives it, and
docs/least-privilege.md shows it (a test keeps the two the same).

Measured on Redis 7.0 and Valkey 8 with a user holding exactly this rule, then with each
part taken away (tests/server/test_acl.py keeps the first half of that honest). Redis 7 and
Valkey check the commands a script calls against the caller's ACL too, so the rule
names each command the scripts (_rules/lua/) call; a test checks that none is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import scripts as _scripts
from .keys import DEFAULT_PREFIX, glob_escaped


@dataclass(frozen=True)
class Part:
    """Some of the rule: the permissions, what needs them, and what goes without them."""

    grants: tuple[str, ...]  # "+command", or a key or channel pattern: "~{prefix}*"
    needed_by: str
    without: str  # what happens to a user without it


# In the order the rule lists them.
PARTS = (
    Part(
        ("~{prefix}*",),
        "every lock: its keys all start with the prefix",
        "every operation fails (NOPERM on the keys)",
    ),
    Part(
        ("+fcall", "+function|load"),
        "every operation: each is one function of redlease's library (Redis 7+ and "
        "Valkey, not a Cluster), which the first process to meet a server without it "
        "loads",
        "each script is sent as EVALSHA instead (the part below): a server that "
        "refuses functions is not asked again until the process restarts",
    ),
    Part(
        ("+evalsha", "+eval"),
        "every operation where functions are not to be had (Redis 6.2, or a user "
        "without the part above): one script, run by its SHA1 (EVAL when the server "
        "has lost it: restarted, flushed, or a replica promoted)",
        "without functions too, every operation fails",
    ),
    Part(
        (
            "+get",
            "+mget",
            "+set",
            "+del",
            "+exists",
            "+pexpire",
            "+pttl",
            "+time",
            "+hget",
            "+hset",
            "+hdel",
            "+hgetall",
            "+lindex",
            "+lrange",
            "+lpush",
            "+rpush",
            "+lpop",
            "+lpos",
            "+lrem",
            "+lset",
            "+zadd",
            "+zcard",
            "+zrange",
            "+zrangebyscore",
            "+zrem",
            "+zremrangebyscore",
            "+zscore",
        ),
        "the commands the scripts call (the server checks them against the user too); "
        "LRANGE only when a lock is inspected or a waiter's place is not known",
        "the operations whose script calls it fail",
    ),
    Part(
        ("+blpop",),
        "a waiter that is not rung through the hub (see below): it blocks on a list of its own",
        "such waits fail",
    ),
    Part(
        ("&{prefix}*", "+subscribe", "+unsubscribe", "+publish", "+pubsub|numsub"),
        "the hub: the one connection per process and server on which waiters are rung, "
        "and the release that rings them",
        "waiters block in BLPOP, one connection each, instead; every process using one "
        "lock must have this part, or none",
    ),
    Part(
        ("+ssubscribe", "+sunsubscribe", "+spublish", "+pubsub|shardnumsub"),
        "the hub on a Cluster node (sharded pub/sub, Redis 7.0+ and Valkey)",
        "on a Cluster, as without the hub; elsewhere nothing (Redis 6.2 knows none of "
        "these commands: leave them out there)",
    ),
    Part(
        ("+client|id", "+client|unblock"),
        "ending at once a BLPOP given up on (a wait that timed out or was cancelled)",
        "its connection is set aside until the server answers the BLPOP by itself (at "
        "its timeout), then used again",
    ),
    Part(
        ("+config|get",),
        "the one-time check of each server: maxmemory-policy (a warning if it may evict "
        "lock keys) and, for Redlock nodes, persistence (a warning if a node keeps "
        "nothing on disk)",
        "no warnings; locks work",
    ),
    Part(
        ("+type",),
        "naming the key in the error for a key of the wrong type under the prefix",
        "that error names the lock, not the key",
    ),
    Part(
        ("+wait",),
        "replicas=: the acknowledgement of the replicas",
        "locks with replicas= fail; others work",
    ),
)


def acl_rule(prefix: str = DEFAULT_PREFIX) -> str:
    """The ACL rule (for ``ACL SETUSER name on >password <rule>``) that lets a user do
    everything redlease does with keys under ``prefix``, and nothing more."""
    escaped = glob_escaped(prefix)
    return " ".join(g.format(prefix=escaped) for part in PARTS for g in part.grants)


def key_pattern(prefix: str = DEFAULT_PREFIX) -> str:
    """The rule's key pattern: every key of every lock under ``prefix``."""
    return "~" + glob_escaped(prefix) + "*"


def channel_pattern(prefix: str = DEFAULT_PREFIX) -> str:
    """The rule's channel pattern: the channels the hubs are rung on."""
    return "&" + glob_escaped(prefix) + "*"


def script_commands() -> set[str]:
    """Every command the scripts call, lower-cased as ACL rules name them
    (``pubsub|numsub`` for a subcommand)."""
    found: set[str] = set()
    for script in _every_script():
        found.update(called(script.source))
    return found


def _every_script() -> tuple[_scripts.Script, ...]:
    return _scripts.every_script()


# redis.call('SET', ...), redis.call(sharded and 'SPUBLISH' or 'PUBLISH', ...), and the
# subcommand of redis.call('PUBSUB', sharded and 'SHARDNUMSUB' or 'NUMSUB', ...).
_CALL = re.compile(r"redis\.p?call\(([^,)]*)(?:,([^,)]*))?")
_WORD = re.compile(r"'([A-Za-z]+)'")


def called(source: str) -> set[str]:
    """The commands ``source`` calls (``redis.call`` and ``redis.pcall``), lower-cased."""
    found: set[str] = set()
    for command, argument in _CALL.findall(source):
        names = [n.lower() for n in _WORD.findall(command)]
        subs = [s.lower() for s in _WORD.findall(argument or "")]
        for name in names:
            if name in _WITH_SUBCOMMAND:
                found.update(f"{name}|{sub}" for sub in subs)
            else:
                found.add(name)
    return found


_WITH_SUBCOMMAND = frozenset({"pubsub", "client", "config", "script"})


def denied_in_script(script: str, line: int) -> set[str]:
    """The commands called on ``line`` of ``script`` (a SHA1 or a function's name: Redis
    7.0 says only where a script was refused a command, not which)."""
    origin = _scripts.origin_of(script, line)
    if origin is None:
        return set()
    file, number = origin
    return called(_scripts.lua_file(file).splitlines()[number - 1])
