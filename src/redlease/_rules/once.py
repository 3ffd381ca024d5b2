"""Scheduled jobs that run once across a fleet (``redlease.once``): the rules, without I/O.

A job's run is a lease of the lock of the job's name (same keys, so a ``Lock`` of that
name waits for it and ``redlease inspect`` shows it), taken by one try that never waits:

* the try (ONCE_ACQUIRE) reads the server's clock; with a period, it is refused when the
  period's run has been made (the record ``P{N}:once``, written by the grant); a held
  name refuses it as any try. Either way the call is skipped (``Skipped``), in one round
  trip;
* the lease lasts ``at_most`` (or ``ttl``, renewed until ``at_most``; ONCE_EXTEND never
  sets it past the run's start plus ``at_most`` by the server's clock);
* its release (ONCE_RELEASE) keeps the name held until the run's start plus
  ``at_least`` by the server's clock, and releases it once that has passed.

Every time that counts is the server's: the run's start is its ``TIME`` in the try, and
the scripts compare it with their own ``TIME``. So nodes whose clocks disagree by
minutes still see one run per period, and nothing kept in the process holds a name
after it exits.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .._base.errors import BackendError, InvalidArgument, LockLost
from .._base.timing import valid_until
from .._base.types import OnLost
from . import arguments as args
from .classify import error_code
from .flows import (
    ONE_FENCE,
    Acquisition,
    Flow,
    Grant,
    LockSpec,
    acquire_reply,
    as_int,
    as_text,
    release,
)
from .front import FrontCore
from .keys import LockKeys
from .lease import LeaseState
from .ops import Command
from .scripts import ONCE_ACQUIRE, ONCE_EXTEND, ONCE_LEAVE, ONCE_RELEASE

# Why a call was skipped (``Skipped.reason``).
RUNNING = "running"  # the name is held: a run under way, its at_least, or a Lock's holder
RAN = "ran this period"  # the period's run has been made, or is under way (``every=``)
LATE = "granted too late"  # the server's grant came back after its lease had run out


@dataclass(frozen=True)
class OnceRule:
    """What is fixed about one scheduled job, checked once."""

    at_most_ms: int
    at_least_ms: int
    period_ms: int  # 0: no period
    lease_ms: int  # the lease's length: at_most, or a shorter ttl renewed until at_most
    fence_as: str | None  # the keyword the decorated job gets its fence through

    @property
    def renews(self) -> bool:
        return self.lease_ms < self.at_most_ms

    @classmethod
    def create(
        cls, at_most: object, at_least: object, every: object, ttl: object, fence_as: object
    ) -> OnceRule:
        most = args.ttl_ms(at_most, "at_most")
        least_s = args.seconds("at_least", at_least)
        if least_s < 0:
            raise InvalidArgument(f"at_least must not be negative, got {args.shown(at_least)}")
        least = 0 if least_s == 0 else args.milliseconds(at_least, "at_least")
        if least > most:
            raise InvalidArgument(
                f"at_least ({args.shown(at_least)}) must not exceed at_most "
                f"({args.shown(at_most)}): the name is never held past at_most"
            )
        period = 0 if every is None else args.milliseconds(every, "every")
        lease = most if ttl is None else args.ttl_ms(ttl, "ttl")
        if lease > most:
            raise InvalidArgument(
                f"ttl ({args.shown(ttl)}) must not exceed at_most ({args.shown(at_most)}): "
                "ttl is the length of a lease renewed until at_most"
            )
        if fence_as is not None and not (isinstance(fence_as, str) and fence_as.isidentifier()):
            raise InvalidArgument(
                f"fence_as must be None or a keyword argument's name, got {args.shown(fence_as)}"
            )
        return cls(most, least, period, lease, fence_as)


class Skipped:
    """A scheduled call that did not run: another node's run holds the name (or its
    ``at_least`` does), or, with ``every=``, this period's run has been made. False in a
    test (``if not run:``); what a decorated job returns instead of its result.

    ``reason`` is ``"running"`` (the name is held), ``"ran this period"`` (with
    ``every``: this period's run has been made or is under way; said first) or (rare: the
    server's grant came back after its lease had run out) ``"granted too late"``.
    ``retry_in``: seconds, by the server's clock, until the name may run again (the
    holder's time left, or until the next period), when the server said; else None."""

    __slots__ = ("name", "reason", "retry_in")

    def __init__(self, name: str, reason: str, retry_in: float | None) -> None:
        self.name, self.reason, self.retry_in = name, reason, retry_in

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        later = "" if self.retry_in is None else f", may run in {self.retry_in:.3f}s"
        return f"<Skipped {self.name!r}: {self.reason}{later}>"


@dataclass(slots=True)
class OnceGrant(Grant):
    """A job's grant: a lock's, and the server's time (ms) at which its run started."""

    started_ms: int = 0


class OnceAttempt(Acquisition):
    """A job's one try (see the module's doc). ``skipped`` says why it gave no grant."""

    def __init__(self, spec: LockSpec, rule: OnceRule) -> None:
        super().__init__(spec, 0.0, wait=False)
        self.rule = rule
        self.skipped: Skipped | None = None
        self.more_keys = ((spec.keys.once, "string"),)  # (the period's record)

    def run(self) -> Flow[Grant | None]:
        spec = self.spec
        sent_at = spec.clock()
        self.outstanding = True
        try:
            reply = yield spec.call(
                ONCE_ACQUIRE,
                self.token,
                str(spec.ttl_ms),
                spec.fair_arg,
                "0",
                spec.keys.bell_prefix,
                ONE_FENCE,
                "",
                "",
                spec.given_up_ms,
                str(self.rule.period_ms),
                keys=(*spec.keys.script_keys, spec.keys.once),
                timeout=self._bound(),
                patient=False,
            )
        except BackendError as failure:
            yield from self._wait_out(failure)  # (a try: raises it, or names a foreign key)
            raise
        fence, pttl, server_us, _place = acquire_reply(reply, spec.ttl_ms)
        if fence > 0:
            grant = OnceGrant(
                self.token, fence, valid_until(sent_at, pttl, spec.ttl), server_us // 1000
            )
            if grant.valid_until > spec.clock():
                return grant
            yield from self.abandon()
            self.skipped = Skipped(spec.name, LATE, None)
            return None
        reason = RAN if fence < 0 else RUNNING
        self.skipped = Skipped(spec.name, reason, pttl / 1000.0 if pttl >= 0 else None)
        return None

    def leave(self, *, keep: bool) -> Flow[Grant | None]:
        """Given up before its run began: the grant, if any, and the period's record it
        wrote go (a run that never began does not use up its period)."""
        yield from _given_up(self.spec, self.token, self._bound(), patient=False)
        return None


def _given_up(
    spec: LockSpec, token: str, timeout: float | None = None, *, patient: bool = True
) -> Flow[None]:
    """ONCE_LEAVE: ``token``'s grant and the period's record it wrote go."""
    yield spec.call(
        ONCE_LEAVE,
        token,
        spec.fair_arg,
        spec.keys.bell_prefix,
        "0",
        spec.given_up_ms,
        "",
        keys=(*spec.keys.script_keys, spec.keys.once),
        timeout=timeout,
        patient=patient,
    )


class RunState(LeaseState):
    """A scheduled run's lease rules (see ``_rules.lease.LeaseState``): it is extended
    never past its run's start plus ``at_most``, and its release keeps the name until
    the start plus ``at_least`` (both by the server's clock)."""

    held_out = "its at_most time is over"

    def __init__(
        self, spec: LockSpec, grant: Grant, on_lost: Callable[[Any], object] | None, rule: OnceRule
    ) -> None:
        super().__init__(spec, grant, on_lost)
        assert isinstance(grant, OnceGrant)
        self.kept_until_ms = grant.started_ms + rule.at_least_ms  # (the server's ms)
        self.ends_ms = grant.started_ms + rule.at_most_ms  # its at_most ends then

    def extend_flow(self, ttl_ms: int, wait: float | None = None) -> Flow[float]:
        spec = self.spec
        sent_at = spec.clock()
        left = as_int(
            (
                yield spec.call(
                    ONCE_EXTEND,
                    self.token,
                    str(ttl_ms),
                    str(self.ends_ms),
                    keys=(spec.keys.lock,),
                    timeout=wait,
                )
            )
        )
        if left <= 0:
            raise LockLost(
                f"job {spec.name!r} is no longer ours: it expired, was taken over, or its "
                "at_most time is over"
            )
        return valid_until(sent_at, left, ttl_ms / 1000.0)

    def abandon_flow(self) -> Flow[None]:
        """The run given back before its job began: the name and the period's run go."""
        return _given_up(self.spec, self.token)

    def release_flow(self, *, hurried: bool = False) -> Flow[None]:
        kept_until = str(self.kept_until_ms)
        return release(
            self.spec, self.token, hurried=hurried, script=ONCE_RELEASE, also=(kept_until,)
        )


class OnceCore(FrontCore):
    """The rules of a job's lock (see ``_rules.front.FrontCore``): renewed while its
    job runs, never past ``at_most``, its leases runs (``RunState``)."""

    def __init__(self, spec: LockSpec, rule: OnceRule, on_lost: OnLost | None) -> None:
        super().__init__(
            spec,
            auto_renew=rule.renews,
            # (renewal stops in time for its last lease to end by at_most; the server caps it)
            max_hold=(rule.at_most_ms - rule.lease_ms) / 1000.0 if rule.renews else None,
            on_lost=on_lost,
            watches=on_lost is not None,  # (on_lost told when at_most has passed)
            kind="once",
        )
        self.rule = rule

    def new_state(self, grant: Grant) -> RunState:
        return RunState(self.spec, grant, self.on_lost, self.rule)


class JobCall:
    """How a decorated job is called. A call is checked before the job's name is taken
    (one that cannot bind would fail after the grant, and with ``every=`` use up the
    period), and gets the run's fence as the keyword ``fence_as``, which the caller may
    not pass. ``shown``: the signature the decorated job shows (None: as ``fn``'s)."""

    def __init__(self, fn: Callable[..., Any], fence_as: str | None) -> None:
        self.fence_as = fence_as
        self.shown: inspect.Signature | None = None
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # (a callable whose signature cannot be read)
            self.signature = None
        if fence_as is None or self.signature is None:
            return
        params = self.signature.parameters
        taken = params.get(fence_as)
        if taken is None:
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                return
            raise InvalidArgument(
                f"fence_as={fence_as!r}, but {getattr(fn, '__qualname__', fn)!r} takes no "
                "such keyword argument"
            )
        if taken.kind is taken.POSITIONAL_ONLY:
            raise InvalidArgument(f"fence_as={fence_as!r} names a positional-only parameter")
        # The fence goes by keyword: the parameters after it can then be given by keyword
        # only (a positional argument would reach the fence's place first).
        shown: list[inspect.Parameter] = []
        after = False
        for p in params.values():
            if p.name == fence_as:
                after = taken.kind is p.POSITIONAL_OR_KEYWORD
                continue
            if after and p.kind is p.VAR_POSITIONAL:
                raise InvalidArgument(
                    f"fence_as={fence_as!r} names a parameter before *{p.name}: positional "
                    "arguments would reach it; make it keyword-only"
                )
            shown.append(
                p.replace(kind=p.KEYWORD_ONLY) if after and p.kind is p.POSITIONAL_OR_KEYWORD else p
            )
        self.shown = self.signature.replace(parameters=shown)

    def check(self, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> None:
        """Raise TypeError for a call the job cannot take, or that passes its fence."""
        fence_as = self.fence_as
        if fence_as is not None and fence_as in kwargs:
            raise TypeError(
                f"job {name!r} gets {fence_as!r} from its run (fence_as): do not pass it"
            )
        if self.signature is None or (not args and not kwargs and self.bare):
            return
        try:
            self._bind(args, kwargs)
        except TypeError as wrong:
            raise TypeError(f"job {name!r} cannot be called so: {wrong}") from None

    @functools.cached_property
    def bare(self) -> bool:
        """Whether a call with no arguments binds: known once (most jobs take none, and
        a bind is about a tenth of a skipped call's instructions)."""
        try:
            self._bind((), {})
        except TypeError:
            return False
        return True

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        assert self.signature is not None
        if self.shown is not None:  # the job as its callers see it, without the fence
            self.shown.bind(*args, **kwargs)
        elif self.fence_as is None:
            self.signature.bind(*args, **kwargs)
        else:
            self.signature.bind(*args, **kwargs, **{self.fence_as: 0})


def skip_message(skipped: Skipped) -> str:
    """The log line of a skipped call."""
    later = "" if skipped.retry_in is None else f"; it may run in {skipped.retry_in:.3f} s"
    return f"scheduled job {skipped.name!r} skipped: {skipped.reason}{later}"


@dataclass(frozen=True)
class Period:
    """A scheduled job's record of its period's run (``every=``; ``redlease inspect``
    shows it): the run that made it, and when the next period begins."""

    run: str  # the token of the run
    next_in: float  # seconds until the next period begins (the record's TTL)


def last_period(name: object, prefix: object, wait: float) -> Flow[Period | None]:
    """The period record a scheduled job of ``name`` keeps, if any: ONCE_ACQUIRE writes
    ``{period number}:{run token}`` at ``P{N}:once``, to expire as the next period
    begins. Two plain reads (the record and its time left), each bounded by ``wait``."""
    key = LockKeys.for_name(args.lock_name(name), args.key_prefix(prefix)).once
    try:
        record = yield Command(("GET", key), wait)
        left = yield Command(("PTTL", key), wait)
    except BackendError as failure:
        if error_code(failure) == "WRONGTYPE":  # another program's key there: no record
            return None
        raise
    if record is None or left is None or as_int(left) < 0:
        return None
    return Period(run=as_text(record).partition(":")[2], next_in=as_int(left) / 1000.0)
