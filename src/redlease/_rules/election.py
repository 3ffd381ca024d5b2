"""The rules of ``Election`` and ``AsyncElection`` (``_async.election`` and its generated
twin) that need no I/O: one leader of a name at a time, with terms.

A candidate is a waiter of a lock kept under the election's keys (``P{N}:elect``), with
``auto_renew``: ``campaign()`` waits in the lock's queue (multiplexed, fair, a dead
candidate skipped) and returns the lease; its fence is the term, strictly increasing.
The candidate's identity rides at the end of its token (in hex), so who leads is read
from the lock key alone, atomically with its term (the fence counter, which only a grant
moves) and its time left. A leader that loses its lease is told by the renewer before
the lease's validity ends, so before a successor can be granted the lock.

Observers register in a hash of the election and are rung, as waiters are, by whoever
changed the leader (the winner of a campaign, or a candidate resigning); a leader that
dies changes nothing on the server until its lease runs out, and observers wake up then
(their wait is bounded by its time left). ``observe()`` yields the leader after each
change; a consumer slower than the changes sees the latest one.
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass
from typing import Any

from .._base.errors import BackendError
from .._base.timing import (
    PASSING_RETRY_BASE,
    PASSING_RETRY_CAP,
    QUEUE_ENTRY_SLACK,
    SHORTEST_WAIT,
    backoff,
)
from .classify import passing
from .flows import EXPIRY_NUDGE, Flow, LockSpec, as_int, as_text
from .ops import Listen, Mailbox, Wait
from .scripts import ELECTION_ANNOUNCE, ELECTION_WATCH

TOKEN_HEX = 32  # new_token()'s length; the identity's hex follows


@dataclass(frozen=True)
class Leader:
    """Who leads an election, and since which term (the fence of its lease)."""

    identity: str
    term: int


def default_identity() -> str:
    return f"{platform.node()}:{os.getpid()}"


def leader_of(reply: Any) -> tuple[Leader | None, int]:
    token, term, pttl = as_text(reply[0]), as_int(reply[1]), as_int(reply[2])
    if not token:
        return None, -2
    try:  # (a candidate's token ends with its identity, never empty)
        identity = bytes.fromhex(token[TOKEN_HEX:]).decode() or "?"
    except ValueError:  # not a candidate's token: something else wrote the key
        identity = "?"
    return Leader(identity, term), pttl


# The flows an election runs besides its candidates' (which are its lock's). ``observers``
# is the key of the observers' hash (``observers_of``).


def observers_of(spec: LockSpec) -> str:
    return spec.keys.lock + ":observers"


def keys_of(spec: LockSpec, observers: str) -> tuple[str, str, str]:
    """An election's keys: its lock's, its fence counter, its observers' hash."""
    return (spec.keys.lock, spec.keys.fence, observers)


def read_leader(spec: LockSpec, observers: str) -> Flow[tuple[Leader | None, int]]:
    """Who leads, and the time its lease has left (ms; -2 if nobody leads)."""
    reply = yield spec.call(ELECTION_WATCH, "", "0", "", keys=keys_of(spec, observers))
    return leader_of(reply)


def announce_change(spec: LockSpec, observers: str) -> Flow[None]:
    """Ring every observer: the leader changed."""
    keys = keys_of(spec, observers)
    yield spec.call(ELECTION_ANNOUNCE, spec.keys.bell_prefix, keys=keys)


def look(
    spec: LockSpec, observers: str, token: str, box: Mailbox | None
) -> Flow[tuple[Leader | None, float, Mailbox | None]]:
    """An observer's look: register as an observer (through the hub if there is one) and
    read who leads; also how long to wait for a ring: until the leader's lease runs out,
    at most a ttl (a leader elected and gone without a word is seen then)."""
    if box is None or box.token != token:
        box = yield Listen(spec.keys.bell_prefix, token, spec.reply_timeout)
    if box is not None and not box.ready:
        box = yield Listen(spec.keys.bell_prefix, token, spec.reply_timeout, box)
    horizon = max(spec.ttl, SHORTEST_WAIT)
    life = math.ceil((horizon + QUEUE_ENTRY_SLACK) * 1000)
    hub = "" if box is None else box.hub
    reply = yield spec.call(ELECTION_WATCH, token, str(life), hub, keys=keys_of(spec, observers))
    leader, pttl = leader_of(reply)
    if pttl >= 0:
        horizon = min(horizon, pttl / 1000 + EXPIRY_NUDGE)
    return leader, max(horizon, SHORTEST_WAIT), box


def retry_after(failure: BackendError, failures: int) -> float:
    """How long an observer waits before looking again after its ``failures``-th
    failure in a row: one that may pass (the server restarting, failing over,
    unreachable for a while) is waited out, for ever; any other is raised."""
    if not passing(failure):
        raise failure
    return backoff(failures, PASSING_RETRY_BASE, PASSING_RETRY_CAP)


def rung(spec: LockSpec, token: str, box: Mailbox | None, wait: float) -> Flow[None]:
    """An observer's wait for a ring (a change of leader), at most ``wait``."""
    yield Wait(spec.keys.bell(token), wait, spec.reply_timeout, None, box)
