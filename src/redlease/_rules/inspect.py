"""What an operator does to a name given by its parts (name, kind, prefix), without
I/O: the INSPECT flow and what its reply means, for ``read_info`` and ``aread_info``
(``_async.inspect`` and its generated twin; for tools such as ``redlease inspect``) and
the lock objects' ``locked()``, ``owned()`` and ``waiting()``; and the forced release
(``redlease release --force``), which ends one hold as its holder would.

Everything comes from one run of the read-only ``INSPECT`` script, so the holders, their
time left, the fence counter and which queue entries are live are one snapshot, judged
by the server's own clock (never this machine's): a waiter's entry is live by the very
rule the scripts that serve waiters use. The script writes nothing, so reading a name
never disturbs it: dead waiters and holds past their time are reported as the server
has them, not cleaned up.

A snapshot is out of date as soon as it arrives. It tells what was true; deciding to
take a lock on it ("it looked free") is a race: take the lock instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .._base.errors import BackendError
from . import arguments as args
from .election import announce_change, observers_of
from .flows import (
    ELECTION,
    LOCK,
    READ_WRITE,
    SEMAPHORE,
    Flow,
    Kind,
    LockSpec,
    as_int,
    as_text,
    release,
)
from .keys import LockKeys, read_back
from .ops import Call
from .scripts import INSPECT

log = logging.getLogger(__name__)

# What ``kind=`` names, and the primitive whose keys it reads.
KINDS: dict[str, Kind] = {
    "lock": LOCK,
    "semaphore": SEMAPHORE,
    "rwlock": READ_WRITE,
    "election": ELECTION,
}


def held_at(key: str, prefix: str) -> tuple[str, str] | None:
    """The (kind, name) whose holders are kept at ``key`` under ``prefix`` (a lock's key,
    a semaphore's holders...), or None for any other key (a fence, a queue; another
    program's): each kind's own layout says."""
    parts = read_back(key, prefix)
    if parts is None:
        return None
    name = parts[0]
    for word, kind in KINDS.items():
        if kind.layout(name, prefix).lock == key:
            return word, name
    return None


# How long ``read_info`` waits for the reply: a read is harmless to wait for, and a busy
# server (or a slow shared machine) should not turn a look into an error.
READ_TIMEOUT = 5.0
# The two flavours' names, for the error that says a client is of the other flavour.
TWINS = {"sync_twin": "read_info", "async_twin": "aread_info"}

EXCLUSIVE = "exclusive"
SHARED = "shared"


@dataclass(frozen=True)
class Holder:
    """One lease the server holds now."""

    token: str  # the holder's full token (the CLI shortens it for display)
    remaining: float | None  # seconds its lease has left on the server; None: no TTL
    mode: str  # "exclusive" (a lock, election, write lease) or "shared" (permit, read)
    # That hold's fence: a semaphore and a read/write lock keep one per hold; a lock's or
    # an election's holder got the counter's (only a grant moves it). None if unknown.
    fence: int | None


@dataclass(frozen=True)
class Waiter:
    """One queued waiter, in queue order. ``live``: it would be served now (its entry's
    deadline has not passed, and the process waiting is still listening for its turn);
    a waiter that gave up, or whose process died, is not, though its entry stays in the
    queue until a release meets it. ``remaining``: seconds until its entry's deadline
    (negative when past)."""

    token: str
    live: bool
    remaining: float


@dataclass(frozen=True)
class LockInfo:
    """A name's state at one instant of the server's clock."""

    name: str
    kind: str  # "lock" | "semaphore" | "rwlock" | "election"
    holders: tuple[Holder, ...]
    fence: int | None  # the fence counter's value (the last fence taken); None if absent
    waiters: tuple[Waiter, ...]  # in queue order, live and dead

    @property
    def held(self) -> bool:
        """Someone holds it (a lock, election), or at least one hold (semaphore, rw)."""
        return bool(self.holders)

    @property
    def live_waiters(self) -> int:
        """How many queued waiters are still within their deadline."""
        return sum(w.live for w in self.waiters)


def kind_of(kind: Kind) -> str:
    """The ``kind=`` word for a primitive's Kind."""
    return next(word for word, known in KINDS.items() if known is kind)


def inspect(keys: LockKeys, name: str, kind: str, timeout: float) -> Flow[LockInfo]:
    """The flow: one INSPECT, decoded."""
    shared = "shared" if keys.extra else "single"
    reply = yield Call(INSPECT, keys.script_keys, (shared, keys.bell_prefix), timeout)
    return decode(name, kind, reply)


def decode(name: str, kind: str, reply: Any) -> LockInfo:
    """The script's reply (see INSPECT) as a LockInfo."""
    _server_us, counter, flat_holders, flat_waiters = reply
    counter_text = as_text(counter)
    # one holder at a time (a lock, an election): its fence is the counter's last value
    single = kind in ("lock", "election") and counter_text
    holders = []
    for i in range(0, len(flat_holders), 4):
        token, left_ms, fence, mode = flat_holders[i : i + 4]
        ms = as_int(left_ms)
        fence_text = as_text(fence)
        holders.append(
            Holder(
                token=as_text(token),
                remaining=None if ms < 0 else ms / 1000.0,
                mode=EXCLUSIVE if as_text(mode) == "w" else SHARED,
                fence=int(fence_text or counter_text) if fence_text or single else None,
            )
        )
    waiters = []
    for i in range(0, len(flat_waiters), 3):
        token, live, left_us = flat_waiters[i : i + 3]
        waiters.append(
            Waiter(token=as_text(token), live=as_int(live) == 1, remaining=as_int(left_us) / 1e6)
        )
    return LockInfo(
        name=name,
        kind=kind,
        holders=tuple(holders),
        fence=int(counter_text) if counter_text else None,
        waiters=tuple(waiters),
    )


def checked(name: object, kind: object, prefix: object) -> tuple[LockKeys, str, str]:
    checked_name = args.lock_name(name)
    checked_kind = args.one_of(kind, "kind", tuple(KINDS))
    keys = KINDS[checked_kind].layout(checked_name, args.key_prefix(prefix))
    return keys, checked_name, checked_kind


def forced_release(name: object, kind: object, prefix: object, token: str) -> Flow[None]:
    """End the hold ``token`` of the ``kind`` named ``name`` as its holder would, as an
    operator does: the next waiter is served at once, the fence counter is untouched (so
    later fences stay greater), an election's observers are told. LockLost if that hold
    had ended."""
    _, checked_name, checked_kind = checked(name, kind, prefix)
    spec = LockSpec.create(
        checked_name,
        READ_TIMEOUT,  # (only the reply's bound: a forced release leaves no mark to last)
        prefix=prefix,
        kind=KINDS[checked_kind],
        # (a limit and a mode, which the shared release reads neither of: a permit, a
        # read hold and a write hold are dropped alike)
        extra=("1", "w") if checked_kind in ("semaphore", "rwlock") else (),
    )
    yield from release(spec, token, forced=True)
    if checked_kind == "election":
        try:  # the observers hear of it at once, not when they next look
            yield from announce_change(spec, observers_of(spec))
        except BackendError as failure:
            log.warning(
                "election %r: released by force, but observers were not told: %s",
                checked_name,
                failure,
            )
