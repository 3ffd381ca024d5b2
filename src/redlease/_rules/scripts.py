"""The Lua scripts: the only code that touches lock keys. Each is a file in ``lua/`` that
states its KEYS, ARGV and reply; this module puts each together and names it, and puts
them all together as one library of Redis functions (``library()``).

Scripts are data. Where the server has functions (Redis 7+, Valkey) each is called as a
function of the library (FCALL), which is loaded once per server (FUNCTION LOAD) and
kept with its data, replicated and written to disk like a key; where it has not (Redis
6.2), or the ACL user may not load or call functions, it is sent as EVALSHA and, on
NOSCRIPT, as EVAL, which caches it again. The library's name carries a digest of its
text, so two versions of redlease on one server each call their own. Nothing is
remembered per client or per class, so any client works with any lock.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import resources

from .._base.timing import UNFAIR_STARVING, UNFAIR_WOKEN
from .keys import FENCE_LEAD_US, FENCE_LIMIT, FENCE_MARGIN_MS

# How the files are put together (the one mechanism): a line "--@include NAME" (a Lua
# comment, kept) is followed by the text of lua/NAME.lua, itself put together the same
# way. An include brings what it includes, and a file included twice in one script is
# there once, where first included. "constants" is made here, from the numbers this
# package shares with the scripts. Each line of the result remembers the file and line it
# came from, so a server's "@user_script:N" is said as the file's own line (place()).
_INCLUDE = re.compile(r"^--@include (\w+)$")

CONSTANTS = {
    "FENCE_LEAD_US": FENCE_LEAD_US,
    "FENCE_LIMIT": FENCE_LIMIT,
    "FENCE_MARGIN_MS": FENCE_MARGIN_MS,
    "UNFAIR_STARVING_US": round(UNFAIR_STARVING * 1e6),
    "UNFAIR_WOKEN_MS": round(UNFAIR_WOKEN * 1000),
}


@cache
def lua_file(name: str) -> str:
    """The text of ``lua/<name>.lua`` as written (``constants``: made from CONSTANTS)."""
    if name == "constants":
        return f"local {', '.join(CONSTANTS)} = {', '.join(map(str, CONSTANTS.values()))}\n"
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text("utf-8")


def lua_lines(name: str) -> list[tuple[str, str, int]]:
    """The lines the server runs for ``name``, each with the file and line it came from:
    (text, file name, line number)."""
    return _expand(name, {name})


def _expand(
    name: str, seen: set[str], shared: tuple[set[str], list[tuple[str, str, int]]] | None = None
) -> list[tuple[str, str, int]]:
    """``name``'s lines with its includes. ``shared`` (the library's): the files included
    that are not scripts (helpers) go there instead, each once, in the order first met,
    and are included from there by every function."""
    lines = []
    for number, line in enumerate(lua_file(name).splitlines(), 1):
        lines.append((line, name, number))
        match = _INCLUDE.match(line)
        if match is None:
            continue
        included = match.group(1)
        if shared is not None and included not in _script_names():
            done, top = shared
            if included not in done:
                done.add(included)
                top += _expand(included, {included}, shared)
        elif included not in seen:
            seen.add(included)
            lines += _expand(included, seen, shared)
    return lines


@dataclass(frozen=True)
class Script:
    name: str
    # Why running it again, after a reply lost with its connection, is harmless (the
    # driver then may); empty: it must not be sent twice.
    retry: str = ""
    # It writes nothing: its function says so (``no-writes``), so that a server out of
    # memory still runs it, as it runs such a script sent by EVAL.
    reads_only: bool = False
    # It calls no command that may add memory (SET, HSET, a push, ZADD): its function
    # says ``allow-oom``, so that a server out of memory runs it, as it runs such a script
    # sent by EVAL (a function without flags is refused there before it starts). An
    # extension must not fail for want of memory it does not use.
    allow_oom: bool = False
    source: str = field(init=False)
    sha: str = field(init=False)
    # per line of source: the file and line it came from
    origins: tuple[tuple[str, int], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        lines = lua_lines(self.name)
        source = "".join(line + "\n" for line, _, _ in lines)
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "sha", hashlib.sha1(source.encode()).hexdigest())
        object.__setattr__(self, "origins", tuple((name, n) for _, name, n in lines))

    def origin(self, line: int) -> tuple[str, int] | None:
        """The file (its name, without ".lua") and line that line ``line`` (from 1) of
        the source came from; None past its end."""
        return self.origins[line - 1] if 0 < line <= len(self.origins) else None

    @cached_property
    def function(self) -> str:
        """Its name as a function of the library (FCALL's first argument)."""
        return f"{library().name}_{self.name}"


def every_script() -> tuple[Script, ...]:
    """Every script of redlease's, in the order defined here."""
    return tuple(v for v in globals().values() if isinstance(v, Script))


@dataclass(frozen=True)
class Library:
    """Every script as one library of Redis functions: each script's text is the body
    of a function taking KEYS and ARGV, registered under ``<name>_<script name>``."""

    name: str  # "redlease_" and the first 12 hex digits of the text's SHA1
    source: str
    # per line of source: the file and line it came from (None: the library's own)
    origins: tuple[tuple[str, int] | None, ...] = field(repr=False)

    def origin(self, line: int) -> tuple[str, int] | None:
        return self.origins[line - 1] if 0 < line <= len(self.origins) else None


@cache
def library() -> Library:
    """The library of every script, built once. The helpers the scripts include (their
    files that are not scripts: waiters, fences...) are defined once, at its top, and
    made once, when it is loaded, not on every call as a script's are."""
    shared: tuple[set[str], list[tuple[str, str, int]]] = (set(), [])
    bodies = [(script, _expand(script.name, {script.name}, shared)) for script in every_script()]
    lines: list[str] = ["#!lua name=@NAME@"]
    origins: list[tuple[str, int] | None] = [None]
    for line, file, number in shared[1]:
        lines.append(line)
        origins.append((file, number))
    for script, body in bodies:
        lines.append(f"local function script_{script.name}(KEYS, ARGV)")
        origins.append(None)
        for line, file, number in body:
            lines.append(line)
            origins.append((file, number))
        said = ["no-writes"] * script.reads_only + ["allow-oom"] * script.allow_oom
        listed = ", ".join(f"'{flag}'" for flag in said)
        flags = f", flags={{{listed}}}" if said else ""
        lines += [
            "end",
            f"redis.register_function{{function_name='@NAME@_{script.name}', "
            f"callback=script_{script.name}{flags}}}",
        ]
        origins += [None, None]
    text = "".join(line + "\n" for line in lines)
    name = "redlease_" + hashlib.sha1(text.encode()).hexdigest()[:12]
    return Library(name, text.replace("@NAME@", name), tuple(origins))


@cache
def _script_names() -> frozenset[str]:
    return frozenset(script.name for script in every_script())


def origin_of(script: str, line: int) -> tuple[str, int] | None:
    """The file and line that line ``line`` of ``script`` came from, as a server names
    the script in an error: a script's SHA1 (EVAL, EVALSHA; its own lines) or a
    function's name (FCALL; the library's lines). None if not one of redlease's."""
    if script.startswith("redlease_"):
        return library().origin(line) if script.startswith(library().name + "_") else None
    found = _every_by_sha().get(script)
    return found.origin(line) if found else None


@cache
def _every_by_sha() -> dict[str, Script]:
    return {v.sha: v for v in every_script()}


def place(script: str, line: int) -> str:
    """Line ``line`` of ``script`` (as ``origin_of`` takes it) as its file's own place
    ("fences.lua:14"); "" if not known."""
    origin = origin_of(script, line)
    if not origin:
        return ""
    file, number = origin
    return "the constants made in scripts.py" if file == "constants" else f"{file}.lua:{number}"


# The lock's
ACQUIRE = Script(
    "acquire", retry="the same token again finds its own grant and reports it, or queues it once"
)
RELEASE = Script(
    "release", retry="a second run finds the mark the first one left and reports the release"
)
EXTEND = Script("extend", retry="setting the same expiry twice is setting it once", allow_oom=True)
LEAVE = Script(
    "leave", retry="a second run finds the entry gone and the grant kept, or already released"
)

ALL = (ACQUIRE, RELEASE, EXTEND, LEAVE)

# A MultiLock's try, all or none, when its names share a server
MULTI_ACQUIRE = Script(
    "multi_acquire",
    retry="a second run finds the locks held with its token: ours, with their fences",
)

# Shared holds: Semaphore and ReadWriteLock (lua/holds.lua)
SHARED_ACQUIRE = Script(
    "shared_acquire",
    retry="the same token again finds its own hold and reports it, or queues it once",
)
SHARED_RELEASE = Script(
    "shared_release", retry="a second run finds the mark the first one left and reports the release"
)
SHARED_EXTEND = Script("shared_extend", retry="setting the same expiry twice is setting it once")
SHARED_LEAVE = Script(
    "shared_leave",
    retry="a second run finds the entry gone and the hold kept, or already given back",
)

# Election: a candidate is a waiter of a lock (the lock's scripts), whose token ends with
# its identity in hex. Observers register in a hash, token -> "deadline_us:0:1[:hub]" (a
# waiter's entry, so the lock's helpers read it), and are rung as waiters are.
ELECTION_EXTEND = Script(
    "election_extend", retry="setting the same expiry twice is setting it once", allow_oom=True
)
ELECTION_WATCH = Script(
    "election_watch", retry="registering again only moves the deadline; the rest reads"
)
ELECTION_ANNOUNCE = Script("election_announce", retry="observers rung twice look again twice")

# Redlock: one run per node (see _rules/quorum.py for how the replies are counted)
REDLOCK_ACQUIRE = Script("redlock_acquire")
REDLOCK_FENCE = Script("redlock_fence")
REDLOCK_RELEASE = Script("redlock_release", allow_oom=True)

# What a name holds and who waits, for tools and ``locked()``
INSPECT = Script("inspect", retry="it only reads", reads_only=True)

# The fence gate for Redis data
FENCED_APPLY = Script("fenced_apply")
FENCED_READ = Script("fenced_read", retry="it only reads", reads_only=True)

# Scheduled jobs (``redlease.once``): a lock's scripts, wrapped. Each runs the lock's own
# script as a function, so a job's lease is a lock's lease on the same keys (a Lock of the
# name waits for it, ``redlease inspect`` shows it).
ONCE_ACQUIRE = Script(
    "once_acquire",
    retry="the same token again finds its own grant (and the period's record) and reports it",
)
ONCE_LEAVE = Script("once_leave", retry="a second run finds the record and the grant gone")
ONCE_RELEASE = Script(
    "once_release",
    retry="a second run keeps the lock until the same time, or finds the first one's release",
)
ONCE_EXTEND = Script(
    "once_extend",
    retry="setting the expiry again only shortens it by the time between the two",
    allow_oom=True,
)
