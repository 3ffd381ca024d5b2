"""Key layout. Every key of one lock carries the same Cluster hash tag, so each script
touches a single slot:

    P{N}               the lock: value = holder's token, always with a TTL
    P{N}:fence         fencing counter: the last fence taken, which follows the server's
                       clock in microseconds; kept twice the lease and a margin past the
                       last grant (see the scripts' take_fences and docs/design.md)
    P{N}:line          the waiters, in arrival order (list), with a TTL: one item each,
                       "token|deadline_us:ttl_ms:since_us[:hub]" (see the scripts'
                       waiters.lua)
    P{N}:bell:<token>  a waiter's doorbell list, pushed by the release script, with a TTL
    P{N}:bell:@<hub>   not a key: the pub/sub channel on which the waiters of one
                       process's hub (its shared wait connection) are rung
    P{N}:released      the token of the last release, for a retried release to find,
                       with a TTL (the release's reply bound)
    P{N}:woken         an unfair lock's waiter woken to compete, for 5 ms (UNFAIR_WOKEN)
    P{N}:mark:<token>  the mark of an attempt, kept twice the acquire's reply bound:
                       "left" when it was given up (the LEAVE script's): an acquire of
                       that token still on its way takes nothing when it lands;
                       "requeued" when a try searched the queue for its token and queued
                       it anew: the same attempt's first try, landing later, searches too
                       (see the scripts' waiters.lua). "left" is never overwritten.
    P{N}:once          a scheduled job's last period run (``redlease.once(every=)``): the
                       period's number, kept until the period ends
    P{N}:gate          the greatest fence the gate for Redis data (FencedRedis) has let
                       through for the resource N, kept a while past the last one

An election named N keeps a lock's keys under ``P{N}:elect`` (``P{N}:elect``,
``P{N}:elect:fence``...; the term is the fence), and ``P{N}:elect:observers``, observer
token -> "deadline_us:0:1[:hub]" (hash, with a TTL). A semaphore named N keeps its keys
apart from the lock N's, under ``P{N}:sem``; a read/write lock, under ``P{N}:rw`` (below,
``:sem`` stands for either):

    P{N}:sem           its holders (sorted set: token -> when the hold runs out, in the
                       server's milliseconds), with a TTL
    P{N}:sem:fences    token -> that hold's fence (hash), and "@writer" -> the token of
                       the write lease held, if any; with a TTL
    P{N}:sem:fence, P{N}:sem:line, P{N}:sem:bell:<token>, P{N}:sem:bell:@<hub>,
    P{N}:sem:mark:<token>  as the lock's (a waiter's item in the line:
                       "token|deadline_us:ttl_ms:limit:mode[:hub]")
    P{N}:sem:released  the tokens of the latest releases (sorted set: token -> until
                       when a retried release may find it), with a TTL

P is the prefix (``redlease:`` unless the lock was given another; it may not contain a
brace) and N the name with "%", "{" and "}" written as "%25", "%7B" and "%7D". So a key
reads back to exactly one (prefix, name, suffix): the prefix ends at the first "{", the
name at the next "}" (the hash tag Redis hashes is exactly N, never empty since names
are not), and the suffix is one of the fixed ones above (none of a lock's starts with
"sem", "rw" or "elect"). No two locks, semaphores, read/write locks or elections share a
key, whatever their names and kinds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .._base.timing import QUEUE_ENTRY_SLACK, UNKNOWN_HOLDER_RECHECK

# A fence counter outlives the last grant by twice the lease plus this margin, and by how
# far it runs ahead of the server's clock (see FENCE_LEAD_US and the scripts' take_fences).
FENCE_MARGIN_MS = 1000
# How far a counter may run ahead of its server's clock, in microseconds: a grant that
# would take it further takes fewer fences (a grant asks for one).
FENCE_LEAD_US = 1000
# Fences are exact integers in Lua's doubles (and in JavaScript) only below this.
FENCE_LIMIT = 2**53


def forgotten_within(ttl_ms: int) -> int:
    """Milliseconds after a name's last release (or its last waiter's last try) within
    which every key redlease wrote for it has expired: its fence counter, the mark of the
    last release, and the queue a waiter that gave up may have left."""
    counter = 2 * ttl_ms + FENCE_MARGIN_MS + math.ceil(FENCE_LEAD_US / 1000)
    queue = math.ceil((max(ttl_ms / 1000.0, UNKNOWN_HOLDER_RECHECK) + QUEUE_ENTRY_SLACK) * 1000)
    return max(counter, queue)


# Where redlease's keys live unless a lock is given another prefix: out of the way of the
# application's own keys, which then cannot break a lock by sharing its key.
DEFAULT_PREFIX = "redlease:"

_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})


def hash_tag(name: str) -> str:
    """The name as the keys' hash tag: braced, with its own braces (and "%") escaped."""
    return "{" + name.translate(_ESCAPES) + "}"


def gate_key(resource: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The key in which the fence gate for Redis data records the greatest fence passed
    for ``resource``: in the hash slot of the lock named so (``P{N}:gate``)."""
    return prefix + hash_tag(resource) + ":gate"


def _crc16(data: bytes) -> int:
    """CRC-16/XMODEM, the checksum Redis Cluster maps keys to slots with."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        crc &= 0xFFFF
    return crc


def hash_slot(key: str | bytes) -> int:
    """The Cluster hash slot of ``key``: of its hash tag (what is between its first "{"
    and the next "}", if not empty), else of the whole key."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return _crc16(data) % 16384


def glob_escaped(prefix: str) -> str:
    """``prefix`` as a literal in a Redis glob pattern (SCAN MATCH, an ACL key pattern)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in prefix)


def every_lock(prefix: str = DEFAULT_PREFIX) -> str:
    """A glob pattern for every key of every lock under ``prefix`` (each one's name in a
    hash tag right after the prefix; the names are read back apart, as they escape
    braces)."""
    return glob_escaped(prefix) + "{*"


def read_back(key: str, prefix: str = DEFAULT_PREFIX) -> tuple[str, str] | None:
    """The (name, suffix) a key under ``prefix`` belongs to (``P{N}:fence`` gives
    ``(name, ":fence")``), or None if it is not one of this layout's keys."""
    if not key.startswith(prefix + "{"):
        return None
    start = len(prefix) + 1
    end = key.find("}", start)
    if end <= start:
        return None
    tag = key[start:end]
    name = tag.replace("%7B", "{").replace("%7D", "}").replace("%25", "%")
    if hash_tag(name) != "{" + tag + "}":  # not as redlease escapes: someone else's key
        return None
    return name, key[end + 1 :]


@dataclass(frozen=True)
class LockKeys:
    lock: str  # a semaphore's: its holders
    fence: str
    queue: str
    bell_prefix: str
    extra: tuple[str, ...] = ()  # a semaphore's: its fences
    # The keys every script of the primitive is sent, in its KEYS order (made once: the
    # warm path sends them on every call).
    script_keys: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        keys = (self.lock, self.fence, self.queue, *self.extra)
        object.__setattr__(self, "script_keys", keys)  # (frozen)

    @classmethod
    def for_name(cls, name: str, prefix: str = DEFAULT_PREFIX) -> LockKeys:
        return cls._under(prefix + hash_tag(name))

    @classmethod
    def for_semaphore(cls, name: str, prefix: str = DEFAULT_PREFIX) -> LockKeys:
        return cls._shared(prefix + hash_tag(name) + ":sem")

    @classmethod
    def for_read_write(cls, name: str, prefix: str = DEFAULT_PREFIX) -> LockKeys:
        return cls._shared(prefix + hash_tag(name) + ":rw")

    @classmethod
    def for_election(cls, name: str, prefix: str = DEFAULT_PREFIX) -> LockKeys:
        return cls._under(prefix + hash_tag(name) + ":elect")

    @classmethod
    def _shared(cls, base: str) -> LockKeys:
        return cls._under(base, (base + ":fences",))

    @classmethod
    def _under(cls, base: str, extra: tuple[str, ...] = ()) -> LockKeys:
        return cls(
            lock=base,
            fence=base + ":fence",
            queue=base + ":line",
            bell_prefix=base + ":bell:",
            extra=extra,
        )

    @property
    def once(self) -> str:
        """A scheduled job's record of its last period run (a lock's keys only)."""
        return self.lock + ":once"

    def bell(self, token: str) -> str:
        return self.bell_prefix + token
