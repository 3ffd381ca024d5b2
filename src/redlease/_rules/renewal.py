"""Lease renewal (the watchdog): one renewer per process keeps every auto-renewed lease
alive, sends the renewals that are due together in one pipelined round trip per
connection, and tells the holder as soon as a lease is lost.

The rules live here, in ``Schedule``, and need no I/O; the renewers only sleep, send and
deliver: ``_sync.renewer`` (two daemon threads per process) and ``_async.renewer`` (one
task per event loop).

The schedule, for a lease of ``ttl`` seconds:

* it is due once a third of the ttl has passed since its last renewal was sent (its
  validity, counted from the send, is down to two thirds): a renewal that fails or hangs
  still leaves room for two more tries before the lease would end;
* a lease within a sixth of the ttl of being due rides along with a batch that is sent
  anyway, so leases converge onto few shared batches instead of one round trip each;
* a reply is waited for at most a third of the ttl, and never past the end of validity
  of any lease the renewer watches: a hung server must not keep the renewer from telling
  another holder in time;
* after a failure the lease is retried once a quarter of its remaining validity has
  passed (at least 10 ms): several tries fit, a refusing server is not hammered;
* renewal stops ``max_hold`` seconds after acquisition; the lease then runs out;
* a lease is lost when the server says it is no longer ours (EXTEND returns 0: taken
  over, evicted, expired) or when its validity runs out without a confirmed renewal.
  The holder is told a few milliseconds *before* validity ends, never after.

Validity is always counted from the moment a renewal was sent (the lease's extend flow), so a
slow reply shortens the lease instead of stretching it. Times come from the monotonic
clock; a lock with an injected clock should not be auto-renewed.

After ``os.fork()`` the child holds none of its parent's leases: every watched lease
reads as lost there (its ``on_lost`` is not called in the child), the child has no
renewer, and the parent's renewer carries on untouched.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._base.errors import BackendError, LockLost
from .._base.timing import SHORTEST_WAIT
from .lease import LeaseState

log = logging.getLogger(__name__)

RENEW_AFTER = 1 / 3  # of the ttl since the last renewal was sent
RIDE_ALONG = 1 / 6  # of the ttl: how early a lease may join a batch sent anyway
REPLY_WAIT = 1 / 3  # of the ttl: the longest wait for a renewal's reply
RETRY_AFTER = 1 / 4  # of the validity left, after a failed renewal
RETRY_FLOOR = 0.01  # a failed renewal is tried again no sooner
# The holder is told this much before validity ends (at most 2% of the ttl), so that a
# late wake-up of the renewer still tells it in time: on a loaded machine a thread that
# wakes may wait for the GIL a switch interval (5 ms) or more.
EARLY_NOTICE = 0.025
NOTICE_SHARE = 0.02


def notice_lead(ttl: float) -> float:
    """How long before the end of validity the holder of an unrenewed lease is told."""
    return min(EARLY_NOTICE, ttl * NOTICE_SHARE)


Loss = tuple[LeaseState, str]


@dataclass(eq=False)
class Renewal:
    """One watched lease and what the renewer knows about it."""

    lease: LeaseState
    io: Any  # the driver that carries its renewals (IO or AsyncIO)
    hold_until: float | None  # renewal stops here (max_hold); None: no cap
    retry_at: float | None = None  # set after a failed renewal

    @property
    def ttl(self) -> float:
        return self.lease.spec.ttl

    @property
    def due(self) -> float:
        if self.retry_at is not None:
            return self.retry_at
        return self.lease.valid_until - self.ttl * (1 - RENEW_AFTER)

    @property
    def notice_at(self) -> float:
        """When the holder must be told, if no renewal has been confirmed by then."""
        return self.lease.valid_until - notice_lead(self.ttl)

    def renewable_at(self, when: float) -> bool:
        return self.hold_until is None or when < self.hold_until

    def next_event(self) -> float:
        due = self.due
        return min(due, self.notice_at) if self.renewable_at(due) else self.notice_at


@dataclass(eq=False)
class Batch:
    """Renewals for one client, sent together by one of its drivers (one pipelined
    round trip)."""

    io: Any
    renewals: list[Renewal]
    flows: list[Generator[Any, Any, float]] = field(default_factory=list)


class Schedule:
    """The renewer's state and rules; the drivers call it under their own lock."""

    def __init__(self) -> None:
        self._renewals: dict[Renewal, None] = {}  # insertion-ordered set

    def __len__(self) -> int:
        return len(self._renewals)

    def add(self, lease: LeaseState, io: Any, now: float, max_hold: float | None) -> Renewal:
        renewal = Renewal(lease, io, None if max_hold is None else now + max_hold)
        self._renewals[renewal] = None
        return renewal

    def discard(self, renewal: Renewal) -> None:
        self._renewals.pop(renewal, None)

    def clear(self) -> list[Renewal]:
        renewals = list(self._renewals)
        self._renewals.clear()
        return renewals

    def expire(self, now: float) -> list[Loss]:
        """Drop leases that are no longer held; return those whose validity ran out."""
        losses: list[Loss] = []
        for renewal in list(self._renewals):
            lease = renewal.lease
            if not lease.is_held():
                self.discard(renewal)  # released, or its holder already found the loss
            elif now >= renewal.notice_at:
                self.discard(renewal)
                losses.append((lease, _why_ran_out(renewal)))
        return losses

    def take_due(self, now: float) -> list[Batch]:
        """The renewals to send now, one batch per client."""
        batches: dict[tuple[int, bool], Batch] = {}
        for renewal in self._renewals:
            if not renewal.renewable_at(now):
                continue
            early = 0.0 if renewal.retry_at is not None else renewal.ttl * RIDE_ALONG
            if renewal.due - early <= now:
                # Each lock has its own driver, but drivers of one client share its
                # connections: one batch per client (and per kind: a replicas=
                # lease's EXTEND cannot share a pipeline, see IO.execute_many).
                client = id(getattr(renewal.io, "client", renewal.io))
                key = (client, renewal.lease.spec.replicas is not None)
                batch = batches.get(key)
                if batch is None:
                    batch = batches[key] = Batch(renewal.io, [])
                batch.renewals.append(renewal)
        return list(batches.values())

    def next_wakeup(self, *, renewing: bool = True) -> float | None:
        """When something is next due (only deadlines if ``renewing`` is false)."""
        if not renewing:
            return min((r.notice_at for r in self._renewals), default=None)
        return min((r.next_event() for r in self._renewals), default=None)

    def start(self, batch: Batch, now: float) -> tuple[list[Any], float]:
        """Start the batch's extend flows (their send time is now) and return their first
        steps and how long their replies are worth waiting for."""
        # Renewals of leases released meanwhile are not sent.
        batch.renewals = [r for r in batch.renewals if r in self._renewals]
        notices = (r.notice_at for r in self._renewals)
        wait = min(
            min((r.ttl * REPLY_WAIT for r in batch.renewals), default=math.inf),
            min(notices, default=math.inf) - now,
        )
        wait = max(wait, SHORTEST_WAIT)
        batch.flows, steps = [], []
        for renewal in batch.renewals:
            lease = renewal.lease
            # The lease's own extend rule (validity from the send; with replicas=, too few
            # acknowledgements; a Redlock's majority), only bounded by the renewer's wait.
            flow = lease.extend_flow(lease.spec.ttl_ms, wait)
            batch.flows.append(flow)
            steps.append(next(flow))
        return steps, wait

    def settle(self, batch: Batch, results: Sequence[Any], now: float) -> list[Loss]:
        """Apply the replies (or errors) of a batch; return the leases found lost."""
        losses: list[Loss] = []
        for renewal, flow, result in zip(batch.renewals, batch.flows, results, strict=True):
            lease = renewal.lease
            if isinstance(result, BaseException):
                _failed_renewal(lease, result)
                renewal.retry_at = now + max(RETRY_FLOOR, (lease.valid_until - now) * RETRY_AFTER)
                continue
            try:
                flow.send(result)
            except StopIteration as done:
                lease.renewed(done.value)
                renewal.retry_at = None
            except LockLost as exc:  # counted as a failed renewal, then (by _tell) as lost
                _failed_renewal(lease, exc)
                self.discard(renewal)
                losses.append((lease, str(exc)))
            except BackendError as exc:  # too few replicas acknowledged it: a failed renewal
                _failed_renewal(lease, exc)
                renewal.retry_at = now + max(RETRY_FLOOR, (lease.valid_until - now) * RETRY_AFTER)
            except Exception as exc:
                log.exception("unexpected reply renewing %r", lease.name)
                _failed_renewal(lease, exc)
                renewal.retry_at = now + max(RETRY_FLOOR, (lease.valid_until - now) * RETRY_AFTER)
        batch.flows = []
        return losses


def _failed_renewal(lease: LeaseState, error: BaseException) -> None:
    labels = lease.labels
    if labels is not None:
        labels.renewal_failed(error)


def _why_ran_out(renewal: Renewal) -> str:
    if not renewal.renewable_at(renewal.lease.valid_until):
        return renewal.lease.held_out
    if renewal.retry_at is not None:
        return "renewals failed until its validity ran out"
    return "its validity ran out before a renewal was confirmed"


def tell(losses: Sequence[Loss]) -> None:
    for lease, reason in losses:
        try:
            lease.mark_lost(reason)
        except Exception:  # the renewer must outlive anything a holder does
            log.exception("telling the holder of %r about its loss failed", lease.name)


def failed(exc: BaseException, count: int) -> list[Any]:
    return [exc] * count
