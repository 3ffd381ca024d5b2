"""Every server and client failure, weighed once: what it means for a lock, in words
(``meaning``), and whether it may pass by itself (``transient``), from what the clients
say it is (its traits, see ``_clients.errors.traits_of``), the code of the server's error
reply and its text. The driver asks both where it builds a BackendError, and the rules
read the answers there (``passing``, ``error_code``). Which reply codes say "this node
no longer serves the slot" (``starts_over``) is here too."""

from __future__ import annotations

import re

from .._base.errors import BackendError, Traits
from . import acl as _acl
from . import scripts as _scripts

_READ_ONLY = (
    "the server is a read-only replica: point redlease at the master (with Sentinel, "
    "a client from sentinel.master_for(...), which follows failovers)"
)
_NO_AUTH = (
    "authentication required: the server asks for a password and the client gave none "
    "(give the client password=, and username= for an ACL user)"
)
_DENIED = "the server refused the command (authentication or ACL permissions)"
_RULE = "the whole rule redlease needs is in docs/least-privilege.md"

# What an error reply's code means for a lock.
_CODES = {
    "READONLY": _READ_ONLY,
    "OOM": "the server is out of memory (maxmemory reached) and refuses writes",
    "LOADING": "the server is still loading its data set",
    "NOPERM": _DENIED,
    "NOAUTH": _NO_AUTH,
    "WRONGPASS": "authentication failed: wrong username or password, or the user is disabled",
    "MASTERDOWN": "the replica lost its master and refuses commands",
    "WRONGTYPE": (
        "a key under redlease's prefix holds a value of another type: something else "
        "writes under that prefix (give redlease a prefix of its own, or remove that key)"
    ),
}

# Refusals a client library may report in its own words (redis-py's AuthenticationError
# is a ConnectionError, though the server was reached): the text, and what it means.
_SAID = (
    ("invalid username-password pair", _CODES["WRONGPASS"]),
    ("HELLO must be called with the client already authenticated", _NO_AUTH),
    (
        "DB index is out of range",
        "the server has no database of that number (see its `databases` setting)",
    ),
)


_NOT_REDIS = (
    "the server does not speak Redis: what answers on that address sent a reply that is "
    "not RESP (is the host or port that of another service?)"
)


def meaning(traits: Traits, code: str, text: str) -> str:
    """What a failure means for a lock, in words."""
    if "not_redis" in traits:
        return _NOT_REDIS
    told = _told(text)
    if told is not None:
        return told
    if "reply" in traits:
        return _CODES.get(code, "the server returned an error")
    if "response" in traits and code in _CODES:
        return _CODES[code]  # (a client's error class for it, or none)
    if "readonly" in traits:
        return _READ_ONLY
    if "oom" in traits or text.startswith("OOM"):
        return _CODES["OOM"]
    if "loading" in traits:
        return _CODES["LOADING"]
    if "denied" in traits:
        return _DENIED
    if "timeout" in traits:
        return "the server did not answer in time"
    if "connection" in traits:
        return "the server cannot be reached"
    return "the server returned an error"


# The texts of Redis 7.0's and Valkey 8's refusals (a client library may have taken the
# code off, so the text is matched, not the code).
_RUN = re.compile(r"(?:User (\S+) has|this user has) no permissions to run the '([^']+)'")
_RUN_IN_SCRIPT = re.compile(
    r"can't run this command or subcommand script: (\w+), on @user_(?:script|function):(\d+)"
)
_ACCESS = re.compile(r"no permissions to access (?:one of the |a )(key|channel)", re.I)


def _told(text: str) -> str | None:
    """What the error's text tells exactly: which permission the user lacks, or that
    the client must authenticate; None if it tells neither."""
    for said, meaning in _SAID:
        if said in text:
            return meaning
    if "Protocol error: unauthenticated" in text or text.startswith(
        ("NOAUTH", "Authentication required")
    ):
        # An unauthenticated client's first command, if more than a few words long (a
        # script call is), is refused as a protocol error, not with NOAUTH.
        return _NO_AUTH
    called = " (called by a script)" if "script:" in text else ""
    if match := _RUN.search(text):
        user, command = match.groups()
        return _may_not(user, f"run {command.upper()}{called}", f"+{command}")
    if match := _RUN_IN_SCRIPT.search(text):
        # Redis 7.0 names the script and the line, not the command: found there
        commands = sorted(_acl.denied_in_script(match.group(1), int(match.group(2))))
        names = " or ".join(x.upper() for x in commands) or "a command"
        grants = " or ".join(f"+{x}" for x in commands) or "the command"
        return _may_not(None, f"run {names}{called}", grants)
    if match := _ACCESS.search(text):
        kind = match.group(1).lower()
        pattern = _acl.key_pattern() if kind == "key" else _acl.channel_pattern()
        return _may_not(
            None, f"use redlease's {kind}s", f"{pattern} (or the pattern of the prefix= used)"
        )
    return None


def _may_not(user: str | None, what: str, grant: str) -> str:
    who = f"the ACL user {user!r}" if user else "the ACL user"
    return f"{who} may not {what}: add {grant} to its rule ({_RULE})"


# Error replies that say "not now" rather than "never": loading its data after a restart,
# a replica that lost its master, a blocked command ended by a role change, a cluster
# resharding or without a majority.
_PASSING = ("LOADING", "MASTERDOWN", "UNBLOCKED", "TRYAGAIN", "CLUSTERDOWN")


def transient(traits: Traits, code: str, text: str) -> bool:
    """Whether a failure may pass by itself: the server was not reached, did not answer
    in time, or answered "not now". A wait with time left tries again after such a
    failure rather than giving up."""
    if "not_redis" in traits or _told(text) is not None:
        return False  # another service, or a refusal its text names: it stays
    if traits & {"connection", "timeout", "loading"}:
        return True
    return code in _PASSING


def passing(error: BaseException) -> bool:
    """Whether ``error`` is a BackendError that may pass by itself (``transient``)."""
    return isinstance(error, BackendError) and error.transient


def error_code(error: BaseException) -> str:
    """The first word of the server's error reply behind a BackendError ("WRONGTYPE",
    "NOSCRIPT"...); "" if the failure was not an error reply."""
    return error.code if isinstance(error, BackendError) else ""


# Redis before 7.0 wraps an error raised inside a script: "ERR Error running script (call
# to f_<sha>): @user_script:42: @user_script: 42: -READONLY You can't write..." or "...:
# @user_script:102: WRONGTYPE Operation...". The code that counts is the inner one.
_WRAPPED = r"ERR Error running script \(call to f_[0-9a-f]{40}\): (?:@user_script: ?\d+: )+-?"
_IN_SCRIPT = re.compile("^" + _WRAPPED + r"([A-Z]+)\b")


def reply_code(text: str) -> str:
    """The code of an error reply's text: its first word (NOSCRIPT, READONLY...), or for
    an error a script met on Redis 6.2, the code inside."""
    inner = _IN_SCRIPT.match(text)
    if inner is not None:
        return inner.group(1)
    return text.split(" ", 1)[0] if text else ""


# Where in a script an error came from, as the server appends it (Redis 7 and Valkey:
# "... script: <sha>, on @user_script:225." or, in a function, "... script:
# redlease_<digest>_acquire, on @user_function:1225."; 6.2: the wrapper above): lines of
# redlease's own scripts, of no use to a reader.
_SCRIPT_PLACE = re.compile(
    r"(?: script: \w+, on @user_(?:script|function):\d+\.?)|(?:" + _WRAPPED + ")"
)


_SCRIPT_SHA = re.compile(r"(?:script: |call to f_)([0-9a-f]{40}\b|redlease_\w+)")
_SCRIPT_LINE = re.compile(r"\buser_(?:script|function):(\d+)\b")


def plain(text: str) -> str:
    """An error's text without the place in redlease's scripts the server adds to it; a
    place left in the message itself (a Lua error's) is said as the script file's own
    line ("fences.lua:14")."""
    sha = _SCRIPT_SHA.search(text)
    said = _SCRIPT_PLACE.sub("", text).strip()
    if sha is None:
        return said
    return _SCRIPT_LINE.sub(lambda m: _scripts.place(sha[1], int(m[1])) or m[0], said)


# Error replies that say the hub's node no longer serves a channel's slot: the hub
# starts over (any other error to a SUBSCRIBE is a refusal: waiters use bells).
REDIRECTIONS = frozenset({"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"})


def starts_over(code: str) -> bool:
    """Whether an error reply of ``code``, read by a hub, means its connection should be
    dropped and its waiters look again (a redirection), rather than that the server
    refuses the hub."""
    return code in REDIRECTIONS
