"""Every server and client error, classified once: what a failure means for a lock, in
words; whether it may pass by itself; which reply codes say "the script is unknown", "a
blocked command was ended" or "this node no longer serves the slot". ``ReplyError`` (the
server's error reply, as the wire's readers return it) and its code are here too."""

from __future__ import annotations

import re

from .._base.errors import BackendError
from .._clients import NotRedis, caught
from . import acl as _acl
from . import scripts as _scripts

# Redis before 7.0 wraps an error raised inside a script: "ERR Error running script (call
# to f_<sha>): @user_script:42: @user_script: 42: -READONLY You can't write..." or
# "...: @user_script:102: WRONGTYPE Operation...". The code that counts is the inner one.
_IN_SCRIPT = re.compile(r"^ERR Error running script .*@user_script: ?\d+: -?([A-Z]+)\b")


def reply_code(text: str) -> str:
    """The code of an error reply's text: its first word (NOSCRIPT, READONLY...), or for
    an error a script met on Redis 6.2, the code inside."""
    inner = _IN_SCRIPT.match(text)
    if inner is not None:
        return inner.group(1)
    return text.split(" ", 1)[0] if text else ""


class ReplyError(Exception):
    """An error reply from the server; ``code`` as ``reply_code`` reads it."""

    @property
    def code(self) -> str:
        return reply_code(str(self))


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


def not_redis(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the server's reply was not RESP (another service answered)."""
    return isinstance(exc, (NotRedis, *caught().protocol))


def describe(exc: BaseException) -> str:
    if not_redis(exc):
        return _NOT_REDIS
    told = _told(exc)
    if told is not None:
        return told
    if isinstance(exc, ReplyError):
        return _CODES.get(exc.code, "the server returned an error")
    errors = caught()
    if isinstance(exc, errors.response) and (code := reply_code(str(exc))) in _CODES:
        return _CODES[code]  # (a client's error class for it, or none)
    if isinstance(exc, errors.readonly):
        return _READ_ONLY
    if isinstance(exc, errors.oom) or str(exc).startswith("OOM"):
        return "the server is out of memory (maxmemory reached) and refuses writes"
    if isinstance(exc, errors.loading):
        return "the server is still loading its data set"
    if isinstance(exc, errors.denied):
        return _DENIED
    if isinstance(exc, (*errors.timeout, TimeoutError)):
        return "the server did not answer in time"
    if isinstance(exc, (*errors.connection, OSError)):
        return "the server cannot be reached"
    return "the server returned an error"


# The texts of Redis 7.0's and Valkey 8's refusals (a client library may have taken the
# code off, so the text is matched, not the code).
_RUN = re.compile(r"(?:User (\S+) has|this user has) no permissions to run the '([^']+)'")
_RUN_IN_SCRIPT = re.compile(
    r"can't run this command or subcommand script: (\w+), on @user_script:(\d+)"
)
_ACCESS = re.compile(r"no permissions to access (?:one of the |a )(key|channel)", re.I)


def _told(exc: BaseException) -> str | None:
    """What the error's text tells exactly: which permission the user lacks, or that
    the client must authenticate; None if it tells neither."""
    text = str(exc)
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


def passing(error: BaseException) -> bool:
    """Whether a BackendError (or a failure) may pass by itself: the server was not
    reached, did not answer in time, or answered "not now". A wait with time left tries
    again after such a failure rather than giving up."""
    cause = error.__cause__ if isinstance(error, BackendError) else error
    if not_redis(cause) or (cause is not None and _told(cause) is not None):
        return False  # another service, or a refusal its text names: it stays
    errors = caught()
    if isinstance(cause, (*errors.connection, *errors.timeout, *errors.loading, OSError)):
        return True
    return error_code(error) in _PASSING


def error_code(error: BaseException) -> str:
    """The first word of the server's error reply behind a failure ("WRONGTYPE",
    "NOSCRIPT"...); "" if the failure was not an error reply."""
    cause = error.__cause__ if isinstance(error, BackendError) else error
    if isinstance(cause, ReplyError):
        return cause.code
    if isinstance(cause, caught().response):
        return reply_code(str(cause))
    return ""


# Where in a script an error came from, as the server appends it (Redis 7 and Valkey:
# "... script: <sha>, on @user_script:225."; 6.2: "ERR Error running script (call to
# f_<sha>): @user_script:42: "): lines of redlease's own scripts, of no use to a reader.
_SCRIPT_PLACE = re.compile(
    r"(?: script: [0-9a-f]{40}, on @user_script:\d+\.?)"
    r"|(?:ERR Error running script \(call to f_[0-9a-f]{40}\): (?:@user_script: ?\d+: )+-?)"
)


_SCRIPT_SHA = re.compile(r"(?:script: |call to f_)([0-9a-f]{40})")
_SCRIPT_LINE = re.compile(r"\buser_script:(\d+)\b")


def plain(text: str) -> str:
    """An error's text without the place in redlease's scripts the server adds to it; a
    place left in the message itself (a Lua error's) is said as the script file's own
    line ("fences.lua:14")."""
    sha = _SCRIPT_SHA.search(text)
    said = _SCRIPT_PLACE.sub("", text).strip()
    if sha is None:
        return said
    return _SCRIPT_LINE.sub(lambda m: _scripts.place(sha[1], int(m[1])) or m[0], said)


def backend_error(
    exc: BaseException, action: str, kind: type[BackendError] = BackendError, server: str = ""
) -> BackendError:
    """``exc`` as the error of ``action``, said in a lock's terms; ``server``: the one
    that failed, named in the message."""
    where = f" on {server}" if server else ""
    said = plain(str(exc))
    error = kind(f"{action} failed{where}: {describe(exc)} ({type(exc).__name__}: {said})")
    error.__cause__ = exc
    return error


def backend_failures() -> tuple[type[BaseException], ...]:
    """What a driver turns into BackendError; anything else (bugs, cancellation) passes
    through. Read where it is caught (``except backend_failures():``): every family loaded
    by then is among them (``_clients``)."""
    return (*caught().base, OSError, ReplyError)


def reply_errors() -> tuple[type[Exception], ...]:
    """An error reply: ours (ReplyError) or one a CLASS connection or client raised. Read
    where it is caught (``except reply_errors():``), as ``caught()`` is."""
    return (ReplyError, *caught().response)


def is_noscript(exc: BaseException) -> bool:
    """The server does not know the script (restarted, SCRIPT FLUSH, a promoted replica)."""
    return isinstance(exc, caught().noscript) or (
        isinstance(exc, ReplyError) and exc.code == "NOSCRIPT"
    )


def is_unblocked(exc: BaseException) -> bool:
    """A blocked command was ended by the server because it changed role (a failover)."""
    if isinstance(exc, ReplyError):
        return exc.code == "UNBLOCKED"
    return isinstance(exc, caught().response) and str(exc).startswith("UNBLOCKED")


# Error replies that say the hub's node no longer serves a channel's slot: the hub
# starts over (any other error to a SUBSCRIBE is a refusal: waiters use bells).
REDIRECTIONS = frozenset({"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"})


def starts_over(error: ReplyError) -> bool:
    """Whether ``error``, read by a hub, means its connection should be dropped and its
    waiters look again (a redirection), rather than that the server refuses the hub."""
    return error.code in REDIRECTIONS
