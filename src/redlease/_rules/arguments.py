"""Argument checks for every public entry point: one rule, one place, one message style."""

from __future__ import annotations

import math
from datetime import timedelta

from .._base.errors import InvalidArgument
from .._base.timing import longest_validity

# Redis refuses expiries that overflow its millisecond clock; we stop far below that.
MAX_TTL_MS = 10**12  # about 31 years
MIN_MS = 1
# The shortest ttl whose lease can be valid at all once the drift margin is taken off
# (3 ms): derived from the validity rule in _base.timing, not restated here.
MIN_TTL_MS = next(ms for ms in range(MIN_MS, 1000) if longest_validity(ms / 1000.0) > 0)


def shown(value: object) -> str:
    """``value`` for an error message: its repr, cut short (and never failing: an int of
    over 4,300 digits has no repr)."""
    if isinstance(value, timedelta):  # its repr reads -5 s as "days=-1, seconds=86395"
        return f"{value.total_seconds():g} s (a timedelta)"
    try:
        text = repr(value)
    except ValueError:
        return f"an int of {value.bit_length()} bits" if isinstance(value, int) else "?"
    return text if len(text) <= 80 else text[:60] + "..." + text[-10:]


def seconds(name: str, value: object) -> float:
    """A duration given as seconds (int or float) or a timedelta, as float seconds."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(
            f"{name} must be a number of seconds or a timedelta, not {type(value).__name__}"
        )
    try:
        result = float(value)
    except OverflowError:  # an int beyond any float
        result = math.inf
    if not math.isfinite(result):
        raise InvalidArgument(f"{name} must be finite, got {shown(value)}")
    return result


def milliseconds(value: object, name: str) -> int:
    """A positive, finite duration within Redis's limits, in whole milliseconds."""
    secs = seconds(name, value)
    if secs <= 0:
        raise InvalidArgument(f"{name} must be positive, got {shown(value)}")
    if secs > MAX_TTL_MS / 1000:  # (before multiplying: a huge float would overflow)
        raise InvalidArgument(
            f"{name} must be at most {MAX_TTL_MS // 1000} seconds, got {shown(value)}"
        )
    return max(math.ceil(secs * 1000), MIN_MS)


def ttl_ms(value: object, name: str = "ttl") -> int:
    """A lease length, in whole milliseconds: long enough that a lease granted at once is
    still valid after the drift margin; a shorter one could never be used, and every
    grant would come back "too late"."""
    ms = milliseconds(value, name)
    if ms < MIN_TTL_MS:
        raise InvalidArgument(
            f"{name} must be at least {MIN_TTL_MS} ms: a lease is valid for its ttl less a "
            f"drift margin (1% + 2 ms), so a shorter one is never valid; got {shown(value)}"
        )
    return ms


def timeout(value: object, name: str = "timeout") -> float | None:
    """A wait bound in seconds: None (wait forever) or a non-negative duration."""
    if value is None:
        return None
    secs = seconds(name, value)
    if secs < 0:
        raise InvalidArgument(f"{name} must not be negative, got {shown(value)}")
    return secs


def replica_wait_ms(value: object, lease_ms: int) -> int:
    """How long a grant waits for its replicas (``WAIT``): by default a tenth of the
    ttl; shorter than the ttl, or an acknowledged grant would already have expired."""
    if value is None:
        return max(math.ceil(lease_ms / 10), MIN_MS)
    ms = milliseconds(value, "replica_timeout")
    if ms >= lease_ms:
        raise InvalidArgument(
            f"replica_timeout must be shorter than the ttl (a grant acknowledged after its "
            f"lease ended is of no use), got {shown(value)}"
        )
    return ms


def renewal(auto_renew: object, max_hold: object, clock: object) -> tuple[bool, float | None]:
    """``auto_renew`` and ``max_hold``, which bounds it (so means nothing without it);
    renewal runs on the real monotonic clock, so it cannot be had with a clock of the
    caller's."""
    renew = flag(auto_renew, "auto_renew")
    hold = optional_positive(max_hold, "max_hold")
    if hold is not None and not renew:
        raise InvalidArgument(
            "max_hold bounds auto_renew and does nothing without it: pass auto_renew=True "
            "or leave max_hold out"
        )
    if renew and clock is not None:
        raise InvalidArgument(
            "clock cannot be combined with auto_renew: the renewer keeps real time"
        )
    return renew, hold


def optional_positive(value: object, name: str) -> float | None:
    """None or a positive duration in seconds."""
    if value is None:
        return None
    secs = seconds(name, value)
    if secs <= 0:
        raise InvalidArgument(f"{name} must be positive, got {shown(value)}")
    return secs


def utf8(value: str, name: str) -> str:
    """``value``, which goes to the server (keys, scripts, SQL parameters) as UTF-8: a
    lone surrogate cannot. InvalidArgument naming ``name`` otherwise."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise InvalidArgument(
            f"{name} must be encodable as UTF-8 ({exc.reason} at index {exc.start}), "
            f"got {shown(value)}"
        ) from None
    return value


def lock_name(value: object) -> str:
    """A lock name: a non-empty str, encodable as UTF-8."""
    if not isinstance(value, str):
        raise InvalidArgument(f"name must be a str, not {type(value).__name__}")
    if not value:
        raise InvalidArgument("name must not be empty")
    return utf8(value, "name")


# An election candidate's identity rides in its tokens (hex), so it is kept short.
MAX_IDENTITY_BYTES = 256


def identity(value: object) -> str:
    """An election candidate's identity: a non-empty str of at most 256 UTF-8 bytes."""
    if not isinstance(value, str):
        raise InvalidArgument(f"identity must be a str, not {type(value).__name__}")
    if not value:
        raise InvalidArgument("identity must not be empty")
    checked = utf8(value, "identity")
    if len(checked.encode()) > MAX_IDENTITY_BYTES:
        raise InvalidArgument(
            f"identity must be at most {MAX_IDENTITY_BYTES} bytes in UTF-8, got {shown(value)}"
        )
    return checked


def key_prefix(value: object) -> str:
    """A key prefix: a str without hash-tag braces (the name's tag must stay the only one),
    encodable as UTF-8."""
    if not isinstance(value, str):
        raise InvalidArgument(f"prefix must be a str, not {type(value).__name__}")
    if "{" in value or "}" in value:
        raise InvalidArgument(f"prefix must not contain '{{' or '}}', got {shown(value)}")
    return utf8(value, "prefix")


def count(value: object, name: str, maximum: int) -> int:
    """A whole number from zero to ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise InvalidArgument(f"{name} must not be negative, got {shown(value)}")
    if value > maximum:
        raise InvalidArgument(f"{name} must be at most {maximum}, got {shown(value)}")
    return value


# More replicas than any deployment has: WAIT would time out on every grant.
MAX_REPLICAS = 1000


def node_timeout(value: object, lease_ms: int) -> float | None:
    """How long a Redlock round waits for each node: None (the default share of the
    ttl) or a positive duration no longer than the ttl: a reply later than that could
    not make a valid lease."""
    secs = optional_positive(value, "node_timeout")
    if secs is not None and secs > lease_ms / 1000:
        raise InvalidArgument(
            f"node_timeout must not be longer than the ttl (a later reply is of no use), "
            f"got {shown(value)}"
        )
    return secs


def clock(value: object) -> None:
    """A clock of the caller's: callable, returning finite seconds (read once here, so
    that a wrong one is refused now rather than met in the middle of a wait)."""
    if value is None:
        return
    if not callable(value):
        raise InvalidArgument("clock must be callable, returning monotonic seconds")
    try:
        now = value()
    except Exception as exc:
        raise InvalidArgument(f"clock() failed: {type(exc).__name__}: {exc}") from None
    try:
        finite = not isinstance(now, bool) and math.isfinite(now)
    except (TypeError, OverflowError):
        finite = False
    if not finite:
        raise InvalidArgument(
            f"clock must return monotonic seconds as a finite number, returned {shown(now)}"
        )


def flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be True or False, not {shown(value)}")
    return value


def callback(value: object, name: str) -> object:
    if value is not None and not callable(value):
        raise InvalidArgument(f"{name} must be callable or None, not {type(value).__name__}")
    return value


def one_of(value: object, name: str, choices: tuple[str, ...]) -> str:
    """One of a few fixed words (a kind of lock, say)."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgument(
            f"{name} must be one of {', '.join(map(repr, choices))}, got {shown(value)}"
        )
    return value


def resource(value: object, *, longest: int | None = None, nul_free: bool = False) -> str:
    """The name of what a fence gate guards: a non-empty str, encodable as UTF-8; at most
    ``longest`` characters and free of NUL where a database column keeps it."""
    if not isinstance(value, str) or not value or (longest is not None and len(value) > longest):
        most = "" if longest is None else f" of at most {longest} characters"
        raise InvalidArgument(
            f"resource must be a non-empty str{most} (the name of what the fence guards), "
            f"got {shown(value)}"
        )
    utf8(value, "resource")
    if nul_free and "\x00" in value:
        raise InvalidArgument(f"resource must be free of NUL characters, got {shown(value)}")
    return value


def fence(value: object, greatest: int, said: str) -> int:
    """A lease's fence, given to a fence gate: an int from 0 to ``greatest`` (what the
    gate's store holds exactly; ``said``: that number as the error writes it)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= greatest:
        raise InvalidArgument(
            f"fence must be an int from 0 to {said} (a lease's fence), got {shown(value)}"
        )
    return value


def replicas_served(replicas: object, direct: bool) -> None:
    """``replicas=`` is for a client that talks to its server directly (``direct``: a
    standalone or Sentinel client, not a Cluster's): WAIT counts the writes of the
    connection that made them."""
    if replicas is not None and not direct:
        raise InvalidArgument(
            "replicas needs a standalone client (redis.Redis, valkey.Valkey; or Sentinel's): "
            "WAIT must run on the connection that made the write"
        )
