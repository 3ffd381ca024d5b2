"""The sans-IO core: every rule of taking, waiting for, extending and releasing a lock.

A flow is a generator that yields operations (``Call`` a script, ``Command``, ``Wait`` on
a doorbell) and receives their replies; it decides, the drivers (``_sync.io`` and
``_async.io``) only carry bytes. A driver that cannot complete an operation throws the
error into the flow. The same flows therefore behave identically in threads and in
asyncio, and are tested with a fake clock and scripted replies.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._base.errors import BackendError, LockError, LockLost
from .._base.timing import (
    MONOTONIC,
    PASSING_RETRY_BASE,
    PASSING_RETRY_CAP,
    QUEUE_ENTRY_SLACK,
    SHORTEST_WAIT,
    UNFAIR_WOKEN,
    UNKNOWN_HOLDER_RECHECK,
    Deadline,
    backoff,
    valid_until,
)
from .._base.types import Clock
from . import arguments as args
from .classify import error_code, passing
from .keys import DEFAULT_PREFIX, LockKeys
from .ops import Call, Command, Listen, Mailbox, Op, Replicas, Sleep, Wait
from .scripts import (
    ACQUIRE,
    ELECTION_EXTEND,
    EXTEND,
    LEAVE,
    RELEASE,
    SHARED_ACQUIRE,
    SHARED_EXTEND,
    SHARED_LEAVE,
    SHARED_RELEASE,
    Script,
)
from .settings import SETTINGS_WAIT

T = TypeVar("T")

# A reply that took longer than this (or the lease's ttl, if longer) is treated as lost.
MIN_REPLY_WAIT = 1.0
# A wake-up after the holder's PTTL is a safety net against holders that died; waking a
# hair after expiry avoids finding the key still there.
EXPIRY_NUDGE = 0.001
# An op sent when a wait's deadline has (all but) passed may still take this long: the
# last try, and the clean-up after a failed one (a slow link's grant given back). So a
# server that is down or hung stretches ``acquire(timeout=)`` by twice this at most.
PAST_DEADLINE = 0.5
# A try (``try_acquire``) never waits for the lock, and against a server that is down or
# hung it gives up within TRY_BOUND seconds, whatever the client's retry policy would do:
# the settings look, its own ops, and the clean-up after a failed one (PAST_DEADLINE).
TRY_BOUND = 2.0
TRY_OPS = TRY_BOUND - SETTINGS_WAIT - PAST_DEADLINE
# The mark of an attempt given up outlives the longest wait for an acquire's reply by
# this factor (see LockSpec.given_up_ms).
GIVEN_UP_FOR = 2
# Fences a grant asks for: one. (The scripts can take several at once and report how
# many they took; nothing asks for more since grants are no longer lent out in batches.)
ONE_FENCE = "1"
# A waiter's place in the queue when a try whose reply was lost may have queued it: the
# script looks for its token (see the scripts' waiters.lua).
UNKNOWN_PLACE = "?"
# Where the place is among the acquire script's arguments (its ARGV[8]).
PLACE_ARG = 7


Flow = Generator[Op, Any, T]


def new_token() -> str:
    """128 random bits, hex: unguessable, so only its holder can release or extend."""
    return os.urandom(16).hex()  # what secrets.token_hex(16) does, in one call


def as_text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def as_int(value: object) -> int:
    if type(value) is int:  # what hiredis and redis-py's parser give: checked first
        return value
    if isinstance(value, (bytes, str)):
        return int(value)
    if isinstance(value, int):
        return value
    raise TypeError(f"expected an integer reply, got {value!r}")


def acquire_reply(raw: object, ttl_ms: int) -> tuple[int, int, int, str]:
    """An acquire script's reply, in any of its shapes (see lua/acquire.lua), as (fence,
    pttl, server_us, place): an integer is a grant on the fast path (its fence; the whole
    ttl left; the server's time not read; not queued), a string a try that took nothing
    ("pttl:seconds:microseconds:place"), a list any other grant."""
    if isinstance(raw, int):
        return raw, ttl_ms, 0, ""
    if isinstance(raw, (bytes, str)):
        pttl, seconds, micros, place = as_text(raw).split(":", 3)
        return 0, int(pttl), int(seconds) * 1_000_000 + int(micros), place
    if isinstance(raw, list) and len(raw) == 5:
        return as_int(raw[0]), as_int(raw[1]), as_int(raw[2]), as_text(raw[4])
    raise TypeError(f"expected an acquire script's reply, got {raw!r}")


@dataclass(frozen=True)
class Kind:
    """What one primitive's flows run: its scripts (with the same arguments and replies
    whatever the kind, but for the ``extra`` its spec appends), its key layout and the
    type of each key. The flows below are the lock's and a semaphore's alike."""

    noun: str
    acquire: Script
    leave: Script
    release: Script
    extend: Script
    layout: Callable[[str, str], LockKeys]
    key_types: tuple[str, ...]
    extend_keys: Callable[[LockKeys], tuple[str, ...]]  # the keys its extend script takes


def _lock_only(keys: LockKeys) -> tuple[str, ...]:
    return (keys.lock,)


def _with_fence(keys: LockKeys) -> tuple[str, ...]:
    return (keys.lock, keys.fence)


def _with_extra(keys: LockKeys) -> tuple[str, ...]:
    return (keys.lock, *keys.extra)


LOCK = Kind(
    "lock",
    ACQUIRE,
    LEAVE,
    RELEASE,
    EXTEND,
    LockKeys.for_name,
    ("string", "string", "list"),
    _lock_only,
)
# The lock's scripts but extend, which also keeps the fence counter (the leader's term,
# which observers read) as long as the leader.
ELECTION = Kind(
    "election",
    ACQUIRE,
    LEAVE,
    RELEASE,
    ELECTION_EXTEND,
    LockKeys.for_election,
    LOCK.key_types,
    _with_fence,
)
_SHARED_TYPES = ("zset", "string", "list", "hash")
# Their spec's extra: (limit, mode), see the shared scripts.
SEMAPHORE = Kind(
    "semaphore",
    SHARED_ACQUIRE,
    SHARED_LEAVE,
    SHARED_RELEASE,
    SHARED_EXTEND,
    LockKeys.for_semaphore,
    _SHARED_TYPES,
    _with_extra,
)
READ_WRITE = Kind(
    "read/write lock",
    SHARED_ACQUIRE,
    SHARED_LEAVE,
    SHARED_RELEASE,
    SHARED_EXTEND,
    LockKeys.for_read_write,
    _SHARED_TYPES,
    _with_extra,
)


@dataclass(frozen=True)
class LockSpec:
    """Everything fixed about one lock: validated once, shared by all its acquisitions."""

    name: str
    ttl: float  # seconds, as the key's PX (whole milliseconds)
    ttl_ms: int
    keys: LockKeys
    fair: bool
    clock: Clock
    reply_timeout: float  # a reply later than this is treated as lost
    replicas: Replicas | None = None
    kind: Kind = LOCK
    extra: tuple[str, ...] = ()  # the kind's last script arguments (a semaphore's limit)
    token_tail: str = ""  # ends every token (an election's candidate: its identity, hex)

    @classmethod
    def create(
        cls,
        name: object,
        ttl: object,
        *,
        fair: object = True,
        prefix: object = DEFAULT_PREFIX,
        clock: Clock | None = None,
        replicas: object = 0,
        replica_timeout: object = None,
        kind: Kind = LOCK,
        extra: tuple[str, ...] = (),
        token_tail: str = "",
    ) -> LockSpec:
        checked_name = args.lock_name(name)
        ttl_ms = args.ttl_ms(ttl)
        checked_fair = args.flag(fair, "fair")
        count = args.count(replicas, "replicas", args.MAX_REPLICAS)
        wait_ms = args.replica_wait_ms(replica_timeout, ttl_ms)
        args.clock(clock)
        return cls(
            name=checked_name,
            ttl=ttl_ms / 1000.0,
            ttl_ms=ttl_ms,
            keys=kind.layout(checked_name, args.key_prefix(prefix)),
            fair=checked_fair,
            clock=clock or MONOTONIC,
            reply_timeout=max(ttl_ms / 1000.0, MIN_REPLY_WAIT),
            # default wait for replicas: a tenth of the lease
            replicas=Replicas(count, wait_ms) if count else None,
            kind=kind,
            extra=extra,
            token_tail=token_tail,
        )

    @property
    def fair_arg(self) -> str:
        return "1" if self.fair else "0"

    @functools.cached_property  # (sent with every acquire: made once)
    def given_up_ms(self) -> str:
        """How long the mark of an attempt given up lasts on the server (see the LEAVE
        script): an acquire of it still on its way (sent on a connection dropped with it
        in flight) is refused when it lands. Twice the longest an acquire's reply is
        waited for: a link that holds one longer than that is one no client waits on."""
        return str(math.ceil(GIVEN_UP_FOR * self.reply_timeout * 1000))

    def call(
        self,
        script: Script,
        *argv: str,
        keys: tuple[str, ...] | None = None,
        replicas: Replicas | None = None,
        timeout: float | None = None,
        patient: bool = True,
        again: tuple[str, ...] | None = None,
    ) -> Call:
        return Call(
            script,
            self.keys.script_keys if keys is None else keys,
            argv,
            self.reply_timeout if timeout is None else timeout,
            replicas,
            patient,
            again,
        )

    @staticmethod
    def unpack(reply: Any, replicas: Replicas | None) -> tuple[Any, int | None]:
        """Split the reply of an op sent with ``replicas`` into (reply, replicas that
        acknowledged it); an op sent without them gives (reply, None)."""
        if replicas is None:
            return reply, None
        value, acked = reply
        return value, acked

    def check_acked(self, acked: int | None, action: str, replicas: Replicas | None) -> None:
        """A grant or extension counts only once enough replicas have it (``replicas=``):
        a failover to a replica that lacks it would free the lock under its holder."""
        if replicas is not None and (acked or 0) < replicas.count:
            raise BackendError(
                f"{action} {self.name!r}: only {acked} of {replicas.count} replicas "
                f"acknowledged it within {replicas.timeout_ms} ms"
            )


@dataclass(slots=True)  # built per cycle, like Call
class Grant:
    """A lock the server gave us: our token, its fencing token, and until when it is ours.
    ``unsure``: a try of its attempt went unanswered and may still land; its release then
    also marks the attempt given up, so that such a try takes nothing."""

    token: str
    fence: int
    valid_until: float
    unsure: bool = field(default=False, kw_only=True)


class Acquisition:
    """One caller's attempt to take a lock, from first try to grant, timeout or give-up.

    ``outstanding`` tells the driver whether anything reached the server: if the attempt is
    interrupted after that, the driver runs ``abandon()``, which leaves the queue and
    releases a lock that may have been granted meanwhile (nothing is left behind).
    """

    # Keys its script reads besides the lock's, with their types (see foreign_key).
    more_keys: tuple[tuple[str, str], ...] = ()

    def __init__(
        self,
        spec: LockSpec,
        timeout: float | None,
        *,
        wait: bool,
        also: tuple[str, ...] = (),
    ) -> None:
        self.spec = spec
        # the acquire script's last arguments, after the kind's (a read/write lock's: the
        # token of the holder's lease of the other mode)
        self.also = also
        self.token = new_token() + spec.token_tail
        # the token's place in the server's queue, as the acquire script's reply tells it
        # and its next try and its leave send it back: "" none; UNKNOWN_PLACE while a
        # first try that may queue has not been answered (its reply lost, or the attempt
        # cut short)
        self.place = ""
        self.deadline = Deadline.after(spec.clock, timeout)
        self._tried_by = Deadline.after(spec.clock, TRY_OPS)
        self.wait = wait
        self.outstanding = False
        self.unsure = False  # a try went unanswered: it may still land (see Grant)
        self.failures = 0  # tries that failed in a way that may pass
        self.woken = False  # rung to compete (an unfair lock's): see UNFAIR_WOKEN
        self.hurried = False  # cleaning up as the process goes away: see abandon()

    def run(self) -> Flow[Grant | None]:
        spec, clock = self.spec, self.spec.clock
        box: Mailbox | None = None
        # A waiter is rung through its process's hub, if the driver has one; with
        # replicas=, on its own bell: the grant must reach them through a write of ours.
        listens = self.wait and spec.replicas is None
        while True:
            if listens and (box is None or box.token != self.token):
                box = yield Listen(spec.keys.bell_prefix, self.token, self._bound())
                listens = box is not None
            # How long this round may wait, so the queue entry can outlive it: bounded by
            # the deadline, and by the ttl so a waiter refreshes its entry now and then.
            horizon = self.deadline.cap(max(spec.ttl, UNKNOWN_HOLDER_RECHECK)) if self.wait else 0
            queue_ms = math.ceil((horizon + QUEUE_ENTRY_SLACK) * 1000) if horizon > 0 else 0
            hub = ""
            unheard = False  # the hub does not listen on this lock's channel yet
            if box is not None and queue_ms:
                if box.ready:
                    hub = box.hub
                elif box.pending:  # the lock is waited for: listen first, then queue
                    try:
                        box = yield Listen(spec.keys.bell_prefix, self.token, self._bound(), box)
                    except BackendError as failure:
                        yield from self._wait_out(failure)
                    listens = box is not None
                    continue
                else:  # a try first: a lock never waited for costs no SUBSCRIBE
                    queue_ms, unheard = 0, True
            replicas = self._replicas()
            sent_at = clock()
            self.outstanding = True
            argv = (
                self.token,
                str(spec.ttl_ms),
                spec.fair_arg,
                str(queue_ms),
                spec.keys.bell_prefix,
                ONE_FENCE,
                hub,
                self.place,
                spec.given_up_ms,
                *spec.extra,
                *self.also,
            )
            again = None
            if queue_ms and not self.place:
                # A first try that may queue: until its reply tells, it may have, if cut
                # short; sent twice, the second finds the first's place. (A later try's
                # place, if a first run of that try renewed it, the server searches for.)
                self.place = UNKNOWN_PLACE
                again = (*argv[:PLACE_ARG], UNKNOWN_PLACE, *argv[PLACE_ARG + 1 :])
            try:
                raw = yield spec.call(
                    spec.kind.acquire,
                    *argv,
                    replicas=replicas,
                    timeout=self._bound(),
                    patient=self.wait,
                    again=again,
                )
            except BackendError as failure:
                self.unsure = True
                yield from self._wait_out(failure)
                continue
            reply, acked = spec.unpack(raw, replicas)
            fence, pttl, server_us, self.place = acquire_reply(reply, spec.ttl_ms)
            if fence > 0:
                spec.check_acked(acked, "acquire", replicas)
                grant = Grant(
                    self.token,
                    fence,
                    valid_until(sent_at, pttl, spec.ttl),
                    unsure=self.unsure,
                )
                if grant.valid_until > clock():
                    return grant
                if (yield from self._gave_back_too_late()):
                    continue
                return None
            if queue_ms == 0:
                if not unheard:
                    return None
                try:  # the hub listens on this lock's channel before we queue
                    box = yield Listen(spec.keys.bell_prefix, self.token, self._bound(), box)
                except BackendError as failure:
                    yield from self._wait_out(failure)
                listens = box is not None
                continue
            wait_for = horizon - (clock() - sent_at)
            if pttl >= 0:
                wait_for = min(wait_for, pttl / 1000.0 + EXPIRY_NUDGE)
            if self.woken:  # lost the race it was woken for: try again once, a bit later
                wait_for, self.woken = min(wait_for, UNFAIR_WOKEN), False
            if wait_for > 0:
                wait_for = max(wait_for, SHORTEST_WAIT)
                replicas = self._replicas()
                rung, acked = spec.unpack(
                    (
                        yield Wait(
                            spec.keys.bell(self.token),
                            wait_for,
                            self._bound(),
                            replicas,
                            box if hub else None,
                        )
                    ),
                    replicas,
                )
                if rung is not None:
                    granted, granted_us, _ = (int(x) for x in as_text(rung).split(":"))
                    if granted > 0:
                        spec.check_acked(acked, "acquire", replicas)
                        # Handed over by a release at server time granted_us; our acquire
                        # ran at server_us, after sent_at. Only the server's elapsed time
                        # is used, never its clock against ours.
                        start = sent_at + max(0, granted_us - server_us) / 1e6
                        grant = Grant(
                            self.token,
                            granted,
                            valid_until(start, spec.ttl_ms, spec.ttl),
                            unsure=self.unsure,
                        )
                        if grant.valid_until > clock():
                            return grant
                        if (yield from self._gave_back_too_late()):
                            continue
                        return None
                    self.woken = not spec.fair
            if self.deadline.expired():
                # Give up, but keep a lock granted in the last instant: it is ours.
                return (yield from self.leave(keep=True))

    def _wait_out(self, failure: BackendError) -> Flow[None]:
        """A try failed on the server's side. A wait with time left on its deadline
        waits out a failure that may pass (the server unreachable, restarting, failing
        over: see ``_rules.classify.passing``) with a growing random delay, and then
        tries again, with the same token (a try that did reach the server is found);
        anything else is raised. Without a deadline the client's retries decide."""

        if error_code(failure) == "WRONGTYPE":
            raise (yield from foreign_key(self.spec, self.more_keys)) from failure
        left = self.deadline.left()
        if not self.wait or left is None or left <= 0 or not passing(failure):
            raise failure
        self.failures += 1
        delay = backoff(self.failures, PASSING_RETRY_BASE, PASSING_RETRY_CAP)
        yield Sleep(min(delay, left))

    def settings_within(self) -> float | None:
        """How long the one-time look at the server's settings may take before this
        attempt (None: its own bound): a wait's deadline counts it; a try's TRY_BOUND
        has room for it."""
        return self.deadline.left() if self.wait else None

    def _bound(self) -> float:
        """How long the reply to this attempt's next op is worth waiting for, connection
        retries included: the lock's reply bound, cut to the time the deadline leaves
        (at least PAST_DEADLINE, for the last try and the clean-up after it), so that a
        server that is down or hung cannot stretch ``acquire(timeout=)``. A
        ``try_acquire`` has TRY_BOUND in all, the client's retries included."""
        if self.hurried:
            return min(self.spec.reply_timeout, PAST_DEADLINE)
        left = (self.deadline if self.wait else self._tried_by).left()
        if left is None:
            return self.spec.reply_timeout
        return min(self.spec.reply_timeout, max(left, PAST_DEADLINE))

    def _replicas(self) -> Replicas | None:
        """The WAIT for replicas after this attempt's next write: ``replicas=``'s, cut to
        the time the deadline leaves, so that it cannot outlast ``acquire(timeout=)``. A
        ``try_acquire`` keeps it whole: its one attempt includes its WAIT."""
        replicas = self.spec.replicas
        if replicas is None or not self.wait:
            return replicas
        left = self.deadline.left()
        return replicas if left is None else replicas.within(left)

    def _gave_back_too_late(self) -> Flow[bool]:
        """A grant came too late to be of use (its validity had ended by the time it was
        read): give it back. True to try again with a new token; False when the attempt
        is over (a ``try_acquire``, or the deadline has passed), so that no link slower
        than the validity, however many late grants it brings, stretches the wait."""
        yield from self.abandon()
        if not self.wait or self.deadline.expired():
            return False
        self.token, self.place, self.unsure = new_token() + self.spec.token_tail, "", False
        return True

    def leave(self, *, keep: bool) -> Flow[Grant | None]:
        grant = yield from leave(
            self.spec,
            self.token,
            keep=keep,
            place=self.place,
            replicas=self._replicas() if keep else None,
            timeout=self._bound(),
            patient=self.wait and not self.hurried,
        )
        if grant is not None:
            grant.unsure = self.unsure
        return grant

    def abandon(self, *, hurried: bool = False) -> Flow[None]:
        """Leave the queue and release whatever may have been granted to this attempt.
        ``hurried``: the attempt was interrupted by the process going away (Ctrl-C, exit,
        a signal): the clean-up gets PAST_DEADLINE and no retry, so that a server that
        does not answer cannot hold the process back; what it leaves expires on its own
        (a queue entry with its deadline, a grant with its ttl)."""
        self.hurried = self.hurried or hurried
        yield from self.leave(keep=False)


def leave(
    spec: LockSpec,
    token: str,
    *,
    keep: bool,
    place: str = "",
    replicas: Replicas | None = None,
    timeout: float | None = None,
    patient: bool = True,
) -> Flow[Grant | None]:
    """The attempt of ``token`` is over: out of the queue (``place``: where it stands
    there, see ``Acquisition.place``), and a grant made to it meanwhile kept (``keep``:
    returned) or given back. Unless a grant is kept, the
    server keeps a mark of it (``given_up_ms``) that an acquire of ``token`` still on its
    way obeys: whichever of the two the server runs first, nothing is left granted to a
    token nobody waits for."""
    sent_at = spec.clock()
    reply, acked = spec.unpack(
        (
            yield spec.call(
                spec.kind.leave,
                token,
                spec.fair_arg,
                spec.keys.bell_prefix,
                "1" if keep else "0",
                spec.given_up_ms,
                place,
                *spec.extra,
                replicas=replicas,
                timeout=timeout,
                patient=patient,
            )
        ),
        replicas,
    )
    fence, pttl, _ = (as_int(x) for x in reply)
    if fence > 0:
        spec.check_acked(acked, "acquire", replicas)
        return Grant(token, fence, valid_until(sent_at, pttl, spec.ttl))
    return None


def extend(spec: LockSpec, token: str, ttl_ms: int, wait: float | None = None) -> Flow[float]:
    """Reset the lease to ``ttl_ms`` from now; returns the new local validity end.
    ``wait``: how long the reply, and the replicas' acknowledgement, are worth waiting
    for (the renewer's bound); by default the lock's own."""
    replicas = spec.replicas
    if replicas is not None and wait is not None:
        replicas = replicas.within(wait)
    sent_at = spec.clock()
    ok, acked = spec.unpack(
        (
            yield spec.call(
                spec.kind.extend,
                token,
                str(ttl_ms),
                keys=spec.kind.extend_keys(spec.keys),
                replicas=replicas,
                timeout=wait,
            )
        ),
        replicas,
    )
    if as_int(ok) != 1:
        raise LockLost(
            f"{spec.kind.noun} {spec.name!r} is no longer ours: it expired or was taken over"
        )
    spec.check_acked(acked, "extend", replicas)
    return valid_until(sent_at, ttl_ms, ttl_ms / 1000.0)


def release(
    spec: LockSpec,
    token: str,
    *,
    forced: bool = False,
    hurried: bool = False,
    script: Script | None = None,
    also: tuple[str, ...] = (),
    unsure: bool = False,
) -> Flow[None]:
    """Delete the lock if it is still ours and serve the next waiter, atomically.
    ``forced``: an operator frees someone else's hold (``redlease release --force``).
    ``hurried``: the process is going away (see ``Acquisition.abandon``): PAST_DEADLINE
    for the reply and no retry; what a server that does not answer keeps expires.
    ``script``: another release script with the same arguments and reply (by default the
    kind's), given ``also`` after them (a scheduled job's: until when it keeps the name).
    ``unsure``: a try of the grant's attempt may still land (see Grant): once released,
    the attempt is marked given up too (a LEAVE), and that try takes nothing."""
    # The release mark lasts as long as the release may be retried (its reply's bound);
    # a forced one leaves none to speak of, or the holder's own release would take it for
    # its retried one and never learn that its lease had been taken away.
    mark_ms = "1" if forced else str(math.ceil(spec.reply_timeout * 1000))
    ok = yield spec.call(
        script or spec.kind.release,
        token,
        spec.fair_arg,
        spec.keys.bell_prefix,
        mark_ms,
        *spec.extra,
        *also,
        timeout=min(spec.reply_timeout, PAST_DEADLINE) if hurried else None,
        patient=not hurried,
    )
    if as_int(ok) != 1:
        raise LockLost(f"{spec.kind.noun} {spec.name!r} had already expired or been taken over")
    if unsure and not hurried:
        yield from leave(spec, token, keep=False, place=UNKNOWN_PLACE)


def foreign_key(spec: LockSpec, more: tuple[tuple[str, str], ...] = ()) -> Flow[LockError]:
    """The error for a lock whose script met a key of the wrong type: something else
    wrote under redlease's prefix. Names the key, found by asking each one's TYPE (the
    lock's, then ``more``: other keys its script reads, with the type each should be)."""
    noun = spec.kind.noun
    for key, wanted in (*zip(spec.keys.script_keys, spec.kind.key_types, strict=True), *more):
        try:
            kind = as_text((yield Command(("TYPE", key), MIN_REPLY_WAIT)))
        except BackendError:
            break  # TYPE denied (ACL) or the server gone: the key goes unnamed
        if kind not in (wanted, "none"):
            return LockError(
                f"{noun} {spec.name!r}: the key {key!r} holds a {kind}, where redlease keeps "
                f"a {wanted}: something else writes under its prefix. Delete the key, "
                f"or give it another prefix="
            )
    return LockError(
        f"{noun} {spec.name!r}: a key under {spec.keys.lock!r} holds the wrong type of value: "
        f"something else writes under its prefix"
    )
