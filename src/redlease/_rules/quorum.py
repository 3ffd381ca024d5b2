"""The Redlock rules, written once and without I/O: quorum counting, validity, fencing
across nodes, release-all, the retry schedule, majority-confirmed extend and release.

A quorum flow is a generator like the single-server flows of ``_rules.flows``, but it yields
``Fanout`` (one script to run on several nodes at once, each reply worth waiting for
``timeout`` seconds from the send) and ``Sleep``; it receives one result per node: the
reply, the exception that stands for "no answer", or ``UNREAD``. The driver in
``_async.redlock`` (and its generated twin) carries them: it writes on every node's
connection, then reads the replies until a majority said yes (acquire, extend, release)
or all of them are in. A node whose
reply is not waited for is not kept waiting on either: its reply is read, unseen, before
that connection's next one, and the slowest nodes of a cycle cost it nothing.

The algorithm (antirez, "Distributed locks with Redis"): take the lock on all N nodes at
once; it is ours iff a majority (N//2 + 1) said yes and the validity left,
``ttl - elapsed - (ttl * 0.01 + 2 ms)``, is positive, ``elapsed`` counted on the
monotonic clock from before the first send. Otherwise it is released on every node
that may hold it (a SET may have landed although its reply was lost or unread), every
reply read, and tried again after a random delay until the deadline, whether the round
failed on contention or on nodes that did not answer.

Fencing across nodes. A per-node counter is not enough: two majorities count
differently. Each node's acquire step increments its counter in the same script that
sets the lock, and replies with it. The fencing token is the highest counter among the
yes-replies read (a majority); every one of those nodes below it is raised to it
(``REDLOCK_FENCE``, only while our lock still stands there) before the lease is
returned, and a majority must be at the token. So when a lease with token ``f`` is
handed out, a majority holds a counter >= ``f``, written while that lease held the node.
The next holder's majority shares at least one node with it, takes that node only after
our key is gone there, reads a counter >= ``f`` and returns at least ``f + 1``. In the
usual case (the nodes agree) this costs no second round trip.

Nodes that said yes unread incremented their counters too, so when the nodes agreed
before, all of them hold ``f``. One that lags (it restarted empty) is raised by the
acquire script itself past the highest token this lock has handed out (``HighWater``),
so it catches up at the next acquisition that reaches it, read or not.

What that assumes: the shared node keeps its counter. While the nodes agree, a token
sits on every node that said yes, so with all N nodes up, up to N - quorum of them may
lose their data (restart without persistence) before the next acquisition; when the
holder reached only a bare majority, or a node still lags, fewer may. Nodes with
``appendfsync always`` remove the caveat.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .._base.errors import BackendError, LockLost, QuorumError
from .._base.timing import Deadline, backoff, drift
from .flows import Grant, LockSpec, as_int, new_token
from .ops import Call, Sleep
from .scripts import EXTEND, REDLOCK_ACQUIRE, REDLOCK_FENCE, REDLOCK_RELEASE, Script

T = TypeVar("T")
log = logging.getLogger(__name__)

# Per-node reply timeout: a small share of the ttl, so that a slow or dead node costs an
# attempt little of its validity (antirez suggests 5-50 ms for a 10 s ttl; we allow up
# to 100 ms because a busy client host can stall that long by itself). A node that has
# not answered in time is a "no" for that attempt.
NODE_TIMEOUT_SHARE = 0.05
NODE_TIMEOUT_CAP = 0.1
NODE_TIMEOUT_FLOOR = 0.002
# A wait without a deadline through rounds that lack a majority of answers logs a warning
# at the first, then at most this often (seconds).
OUTAGE_SAID_EVERY = 30.0

# Retry schedule after a failed attempt: a random delay from an exponentially growing
# range (clients that split the vote must not retry in step), never longer than the
# time until a majority's holders expire (plus a random hair), nor than the deadline.
RETRY_BASE = 0.002
RETRY_CAP = 0.05
MIN_RETRY = 0.001


class QuorumRules:
    """Where Redlock's safety is decided: the size of a majority, when validity starts,
    and where a failed round and a release are undone. The harness's deliberately wrong
    variants (``redlease.tools.chaos.unsafe``) override these to show that its checker catches
    each mistake; redlease itself only ever uses these."""

    def quorum(self, n: int) -> int:
        return n // 2 + 1

    def validity_start(self, sent_at: float, now: float) -> float:
        return sent_at  # acquiring took time: it comes off the validity

    def undo_round(self, tally: Tally, n: int) -> list[int]:
        """Nodes to release on after a failed round: every node that may have applied the
        SET (it said yes, or its reply is missing or unread)."""
        return [i for i in range(n) if i not in tally.held and i not in tally.unsent]

    def release_on(self, believed: frozenset[int]) -> list[int] | None:
        """Nodes a lease is released on (None: every node; one whose reply to the
        acquire was lost may hold it too)."""
        return None


SAFE = QuorumRules()


class Unsent(BackendError):
    """A node's command never left the client (no connection could be made): that node
    cannot have applied it, so there is nothing to release there."""


def said_yes(reply: Any) -> bool:
    """A node's reply to a release or an extend: it was ours there and it is done (a
    reply of another shape than the script's is no yes)."""
    return not isinstance(reply, BaseException) and _read(reply, lambda r: as_int(r) == 1)


def took_it(reply: Any) -> bool:
    """A node's reply to an acquire: the lock is ours there, and this is its fence
    counter (the script answers a grant with the counter alone, an integer)."""
    return isinstance(reply, int) and not isinstance(reply, bool) and reply > 0


# What reading a reply of another shape than the script's raises.
_MALFORMED = (TypeError, ValueError, IndexError, KeyError)
NOT_UNDERSTOOD = "the node's reply was not understood (is it redlease's script that ran?)"


def _read(reply: Any, read: Callable[[Any], bool]) -> bool:
    try:
        return read(reply)
    except _MALFORMED:
        return False


class _Unread:
    def __repr__(self) -> str:
        return "UNREAD"


# The result of a node whose reply a fan-out did not wait for: enough others said yes.
# It may have said yes or no, or not answered: to the rules it counts as none of them.
UNREAD: Any = _Unread()


@dataclass(slots=True)  # built per cycle: see _rules.flows.Call
class Fanout:
    """Run ``call`` on each of ``nodes`` at once; each reply is worth ``timeout`` seconds
    from the first send. The driver answers with one result per node, in order: the
    reply, the exception that stands for no reply, or ``UNREAD``.

    ``enough``: once that many replies satisfy ``yes``, the driver may stop reading and
    answer ``UNREAD`` for the rest (0: read every reply). It then reads those replies,
    unseen, before its next use of their connections. Waiting for a majority rather than
    for the slowest node takes about a tenth off an uncontended 5-node cycle."""

    call: Call
    nodes: tuple[int, ...]
    timeout: float
    enough: int = 0
    yes: Callable[[Any], bool] = said_yes


QuorumFlow = Generator[Fanout | Sleep, Any, T]


@dataclass(slots=True)  # built per cycle: see _rules.flows.Call
class QuorumGrant(Grant):
    """A Redlock grant: also the nodes that said yes (which the harness's wrong
    ``release_believed_only`` releases on)."""

    nodes: frozenset[int] = frozenset()


class HighWater:
    """The highest fencing token one Redlock has handed out. Sent with each acquire, it
    raises a lagging node's counter past it (see REDLOCK_ACQUIRE): a node that restarted
    empty catches up at the next acquisition, even one that does not read its reply; and
    this lock's own tokens keep increasing even if every node lost its counter. Threads
    race on it harmlessly: a lost update only makes it lower."""

    __slots__ = ("fence",)

    def __init__(self) -> None:
        self.fence = 0

    def passed(self, fence: int) -> None:
        if fence > self.fence:
            self.fence = fence


@dataclass(frozen=True)
class QuorumSpec:
    """Everything fixed about one Redlock: the lock itself and its nodes; and the one
    thing that changes, the highest token it has handed out (``high``)."""

    lock: LockSpec
    nodes: tuple[str, ...]  # how each node is named in errors
    node_timeout: float
    rules: QuorumRules = SAFE
    quorum: int = field(init=False)  # how many nodes make a majority
    everywhere: tuple[int, ...] = field(init=False)  # every node's index
    high: HighWater = field(init=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.nodes)
        object.__setattr__(self, "quorum", self.rules.quorum(n))
        object.__setattr__(self, "everywhere", tuple(range(n)))
        object.__setattr__(self, "high", HighWater())

    @classmethod
    def create(
        cls,
        lock: LockSpec,
        nodes: Sequence[str],
        node_timeout: float | None,
        rules: QuorumRules = SAFE,
    ) -> QuorumSpec:
        if node_timeout is None:
            node_timeout = max(
                NODE_TIMEOUT_FLOOR, min(lock.ttl * NODE_TIMEOUT_SHARE, NODE_TIMEOUT_CAP)
            )
        return cls(lock, tuple(nodes), node_timeout, rules)

    def fan_out(
        self,
        script: Script,
        keys: tuple[str, ...],
        *argv: str,
        nodes: Sequence[int] | None = None,
        yes: Callable[[Any], bool] | None = None,
        wait: float | None = None,
    ) -> Fanout:
        """``script`` on ``nodes`` (default: all); with ``yes``, a majority of replies that
        satisfy it is enough (see ``Fanout``); replies are worth ``wait`` seconds (default
        ``node_timeout``)."""
        timeout = self.node_timeout if wait is None else wait
        call = Call(script, keys, argv, timeout)
        at = self.everywhere if nodes is None else tuple(nodes)
        if yes is None:
            return Fanout(call, at, timeout)
        return Fanout(call, at, timeout, self.quorum, yes)

    @property
    def lock_and_fence(self) -> tuple[str, str]:
        return (self.lock.keys.lock, self.lock.keys.fence)


def _why(result: BaseException) -> str:
    if isinstance(result, BackendError) and result.reason:
        return result.reason
    return f"{type(result).__name__}: {result}"


class Tally:
    """The replies of one acquire round, node by node."""

    def __init__(self, fan: Fanout, results: Sequence[Any]) -> None:
        self.counters: dict[int, int] = {}  # yes: node -> its fence counter
        self.held: dict[int, int] = {}  # held by another: node -> its pttl ms
        self.failures: dict[int, str] = {}
        self.unsent: set[int] = set()
        for node, result in zip(fan.nodes, results, strict=True):
            if result is UNREAD:
                continue
            if isinstance(result, BaseException):
                self.failures[node] = _why(result)
                if isinstance(result, Unsent):
                    self.unsent.add(node)
                continue
            if took_it(result):
                self.counters[node] = result
            elif _read(result, lambda r: as_int(r[0]) == 0 and as_int(r[2]) >= -2):
                self.held[node] = as_int(result[2])
            else:  # a reply of another shape is neither a yes nor a no: that node failed
                self.failures[node] = NOT_UNDERSTOOD

    @property
    def answered(self) -> int:
        return len(self.counters) + len(self.held)

    def free_in(self, quorum: int) -> float | None:
        """Seconds until a majority could be free (holders' PTTLs), None if unknown."""
        waits = [0.0] * len(self.counters)  # ours: released right away
        for pttl in self.held.values():
            if pttl == -1:
                return None  # a key without TTL (not ours): its end cannot be known
            waits.append(max(0, pttl) / 1000.0)
        waits.sort()
        return waits[quorum - 1] if len(waits) >= quorum else None


def failures_by_name(spec: QuorumSpec, failures: dict[int, str]) -> dict[str, str]:
    return {spec.nodes[i]: why for i, why in sorted(failures.items())}


def retry_delay(spec: QuorumSpec, attempt: int, tally: Tally, rng: random.Random | None) -> float:
    gen: Any = rng or random
    delay = backoff(attempt, RETRY_BASE, min(RETRY_CAP, spec.lock.ttl), gen)
    free_in = tally.free_in(spec.quorum)
    if free_in is not None and free_in < delay:
        delay = free_in + gen.uniform(0.0, RETRY_BASE)
    return max(delay, MIN_RETRY)


class QuorumAcquisition:
    """One caller's attempt to take a Redlock. Each round has a token of its own: a
    release of an earlier round, held up on a stopped node's old connection, could
    otherwise run there after a later round's SET and delete the key that round holds.
    (A SET of an earlier round that lands late stays until its ttl, as a lost one would.)
    ``outstanding`` tells the driver whether ``abandon()`` is needed if the attempt is
    interrupted: true from a send until the release that follows a failed round."""

    def __init__(
        self,
        spec: QuorumSpec,
        timeout: float | None,
        *,
        wait: bool,
        rng: random.Random | None = None,
    ) -> None:
        self.spec = spec
        self.token = new_token()
        self.deadline = Deadline.after(spec.lock.clock, timeout)
        self.wait = wait
        self.outstanding = False
        self._rng = rng
        self._outage_said: float | None = None  # when a wait last said it found no quorum

    def settings_within(self) -> float | None:
        """How long the one-time look at the nodes' settings may take before this
        attempt: a wait's deadline counts it (None: the look's own bound)."""
        return self.deadline.left() if self.wait else None

    def _say_outage(self, tally: Tally) -> None:
        """A wait without a deadline goes on through an outage (a majority of nodes may
        be back in a moment), but says so: at once, then every OUTAGE_SAID_EVERY s."""
        now = self.spec.lock.clock()
        if self._outage_said is not None and now - self._outage_said < OUTAGE_SAID_EVERY:
            return
        self._outage_said = now
        spec = self.spec
        log.warning(
            "Redlock %r: only %d of %d nodes answered, %d needed; waiting on (no timeout "
            "was given): %s",
            spec.lock.name,
            tally.answered,
            len(spec.nodes),
            spec.quorum,
            "; ".join(f"{k}: {v}" for k, v in failures_by_name(spec, tally.failures).items()),
        )

    def run(self) -> QuorumFlow[QuorumGrant | None]:
        spec, lock = self.spec, self.spec.lock
        attempt = 0
        while True:
            sent_at = lock.clock()
            self.outstanding = True
            fan = spec.fan_out(
                REDLOCK_ACQUIRE,
                spec.lock_and_fence,
                self.token,
                str(lock.ttl_ms),
                str(spec.high.fence),
                yes=took_it,
            )
            tally = Tally(fan, (yield fan))
            if len(tally.counters) >= spec.quorum:
                grant = yield from self._fence(tally, sent_at)
                if grant is not None:
                    return grant
            yield from self._release(spec.rules.undo_round(tally, len(spec.nodes)))
            self.outstanding = False
            self.token = new_token()
            # A round without a quorum is retried until the deadline, whether the nodes
            # were busy or unreachable (a node may be back in a moment); the error says
            # which it was in the last round: an outage is not contention.
            if not self.wait or self.deadline.expired():
                if tally.answered < spec.quorum:
                    raise QuorumError(
                        f"acquire {lock.name!r}: only {tally.answered} of {len(spec.nodes)} "
                        f"nodes answered, {spec.quorum} needed",
                        failures_by_name(spec, tally.failures),
                    )
                return None
            if tally.answered < spec.quorum and self.deadline.left() is None:
                self._say_outage(tally)
            delay = self.deadline.cap(retry_delay(spec, attempt, tally, self._rng))
            if delay > 0:
                yield Sleep(delay)
            attempt += 1

    def _fence(self, tally: Tally, sent_at: float) -> QuorumFlow[QuorumGrant | None]:
        spec, lock = self.spec, self.spec.lock
        top = max(tally.counters.values())
        behind = sorted(node for node, c in tally.counters.items() if c < top)
        confirmed = len(tally.counters) - len(behind)
        if behind:
            # Raise every yes-node that lags (not just enough of them): the more nodes
            # hold the token, the more of them may later lose their data safely.
            fan = spec.fan_out(
                REDLOCK_FENCE,
                spec.lock_and_fence,
                self.token,
                str(top),
                str(lock.ttl_ms),
                nodes=behind,
            )
            results = yield fan
            confirmed += sum(1 for r in results if said_yes(r))
        now = lock.clock()
        until = spec.rules.validity_start(sent_at, now) + lock.ttl - drift(lock.ttl)
        if confirmed >= spec.quorum and until > now:
            spec.high.passed(top)
            return QuorumGrant(self.token, top, until, frozenset(tally.counters))
        return None

    def _release(self, nodes: Sequence[int]) -> QuorumFlow[None]:
        # Every reply is read: a failed acquisition leaves no key behind once it returns.
        if nodes:
            yield _release_fan(self.spec, self.token, nodes, majority=False)

    def abandon(self, *, hurried: bool = False) -> QuorumFlow[None]:
        """Release whatever any round of this attempt may have taken, on every node
        (each within its node timeout, hurried or not: see ``Acquisition.abandon``)."""
        nodes = range(len(self.spec.nodes))
        yield from self._release(list(nodes))


def _release_fan(
    spec: QuorumSpec, token: str, nodes: Sequence[int] | None, *, majority: bool
) -> Fanout:
    yes = said_yes if majority else None
    return spec.fan_out(REDLOCK_RELEASE, (spec.lock.keys.lock,), token, nodes=nodes, yes=yes)


def _count_ours(fan: Fanout, results: Sequence[Any]) -> tuple[int, dict[int, str]]:
    ours, failures = 0, {}
    for node, result in zip(fan.nodes, results, strict=True):
        if isinstance(result, BaseException):
            failures[node] = _why(result)
        elif result is UNREAD:
            continue
        elif said_yes(result):
            ours += 1
        elif not _read(result, lambda r: as_int(r) in (0, 1)):
            failures[node] = NOT_UNDERSTOOD  # (neither a yes nor a no: it cannot tell)
    return ours, failures


def extend(
    spec: QuorumSpec, token: str, ttl_ms: int, wait: float | None = None
) -> QuorumFlow[float]:
    """Reset the lease to ``ttl_ms`` on every node; returns the new validity end. Counts
    only if a majority confirms in time; raises LockLost when a majority says it is not
    ours, QuorumError when too few answered to tell. ``wait``: how long the replies are
    worth waiting for (the renewer's bound); by default ``node_timeout``."""
    lock = spec.lock
    sent_at = lock.clock()
    fan = spec.fan_out(EXTEND, (lock.keys.lock,), token, str(ttl_ms), yes=said_yes, wait=wait)
    ours, failures = _count_ours(fan, (yield fan))
    ttl = ttl_ms / 1000.0
    until = sent_at + ttl - drift(ttl)
    if ours >= spec.quorum:
        if until > lock.clock():
            return until
        raise QuorumError(f"extend {lock.name!r}: confirmed too late to be of use", {})
    if ours + len(failures) < spec.quorum:
        raise LockLost(
            f"lock {lock.name!r} is no longer ours on a majority of nodes: it expired or was "
            "taken over"
        )
    raise QuorumError(
        f"extend {lock.name!r}: confirmed by {ours} of {len(spec.nodes)} nodes, "
        f"{spec.quorum} needed",
        failures_by_name(spec, failures),
    )


def release(spec: QuorumSpec, token: str, believed: frozenset[int]) -> QuorumFlow[None]:
    """Release on every node (a node whose earlier reply was lost may hold it too).
    Raises LockLost if a majority no longer held it, QuorumError if too few answered."""
    lock = spec.lock
    fan = _release_fan(spec, token, spec.rules.release_on(believed), majority=True)
    ours, failures = _count_ours(fan, (yield fan))
    if ours >= spec.quorum:
        return
    if ours + len(failures) < spec.quorum:
        raise LockLost(f"lock {lock.name!r} had already expired or been taken over")
    raise QuorumError(
        f"release {lock.name!r}: confirmed by {ours} of {len(spec.nodes)} nodes; the rest "
        "expire with the ttl",
        failures_by_name(spec, failures),
    )
