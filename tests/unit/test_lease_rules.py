"""The rules of a held lease and of its renewal, driven by hand with scripted replies and a
fake clock: validity, loss and release, the holders' tables, and the renewer's schedule."""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, cast

import pytest
import redis

import redlease
from redlease._base import fork as _fork
from redlease._base.timing import SHORTEST_WAIT, drift
from redlease._rules import flows as _flows
from redlease._rules import lease as _lease
from redlease._rules import ops as _ops
from redlease._rules import renewal as _renewal
from redlease._rules import scripts as _scripts
from redlease._wire.errors import backend_error
from redlease.testing import FakeClock

NAME = "orders:42"
# Thirds and sixths of it are exact floats: the schedule's edges are hit, not approached.
TTL = 3.0
LOST_WORDS = "lock 'orders:42' is no longer ours: it expired or was taken over"


def spec(clock: FakeClock, ttl: float = TTL, **options: Any) -> _flows.LockSpec:
    return _flows.LockSpec.create(NAME, ttl, clock=clock, **options)


def step(flow: Generator[Any, Any, Any], reply: Any) -> Any:
    """Send a reply; return the next op, or ('done', value) when the flow ends."""
    try:
        return flow.send(reply)
    except StopIteration as stop:
        return ("done", stop.value)


def grant(s: _flows.LockSpec) -> _flows.Grant:
    """The grant an acquire flow reads from a reply that gives the whole ttl at once."""
    flow = _flows.Acquisition(s, None, wait=False).run()
    next(flow)
    reply: Any = [7, s.ttl_ms, 1_000_000, 1, ""]
    if s.replicas is not None:
        reply = (reply, s.replicas.count)
    done, granted = step(flow, reply)
    assert done == "done"
    assert isinstance(granted, _flows.Grant)
    return granted


def held(
    clock: FakeClock, ttl: float = TTL, told: list[Any] | None = None, **options: Any
) -> _lease.LeaseState:
    """A lease granted now; ``told`` collects what its ``on_lost`` is called with."""
    s = spec(clock, ttl, **options)
    return _lease.LeaseState(s, grant(s), None if told is None else told.append)


class Holder:
    """A thread or task as the tables see it: any object a weak reference can name."""


class Meter:
    """Stands in for a lock's metric labels: records what the rules report to them."""

    def __init__(self, *, broken: bool = False) -> None:
        self.ends: list[tuple[float, bool]] = []
        self.renewal_failures: list[BaseException] = []
        self.broken = broken

    def ended(self, since: float, *, lost: bool) -> None:
        if self.broken:
            raise RuntimeError("the metrics exporter is broken")
        self.ends.append((since, lost))

    def renewal_failed(self, error: BaseException) -> None:
        self.renewal_failures.append(error)


def metered(lease: _lease.LeaseState, broken: bool = False) -> Meter:
    meter = Meter(broken=broken)
    lease.metered(cast(Any, meter), 5.0)
    return meter


class Driver:
    """What the schedule knows of a lease's driver: the client whose connections it uses."""

    def __init__(self, client: object) -> None:
        self.client = client


def watch(
    schedule: _renewal.Schedule, lease: _lease.LeaseState, io: object, max_hold: float | None = None
) -> _renewal.Renewal:
    """Watched as the renewer watches: a release or loss takes it off the schedule."""
    renewal = schedule.add(lease, io, lease.spec.clock(), max_hold)
    lease.watched(lambda: schedule.discard(renewal))
    return renewal


def failure(action: str) -> redlease.BackendError:
    return backend_error(redis.TimeoutError("Timeout reading from socket"), action)


@dataclass
class Holding:
    """A lease as a reentrant lock keeps it: in a holders' table, watched by a renewer."""

    lease: _lease.LeaseState
    holders: _lease.Holders
    holder: Holder
    told: list[Any]
    unwatched: list[int]


def holding() -> Holding:
    told: list[Any] = []
    h = Holding(held(FakeClock(), told=told), _lease.Holders(), Holder(), told, [])
    h.holders.hold(h.holder, h.lease)
    h.lease.watched(lambda: h.unwatched.append(1))
    return h


# -- a lease's own state ------------------------------------------------------------------


def test_a_token_is_shown_by_its_first_characters_and_never_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert _lease.short_token("0123456789abcdef") == "01234567…"
    assert _lease.short_token("01234567") == "01234567"  # no longer than shown: as it is
    lease = held(FakeClock())
    with caplog.at_level(logging.WARNING, logger="redlease._rules.lease"):
        lease.mark_lost("taken over")
    assert f"'orders:42' ({lease.token[:8]}…) was lost: taken over" in caplog.text
    with pytest.raises(redlease.LockLost) as lost:
        lease.check()
    assert "lost" in repr(lease)
    for text in (caplog.text, str(lost.value), repr(lease)):
        assert lease.token not in text


def test_validity_counts_from_before_the_acquire_was_sent_and_ends_at_valid_until() -> None:
    clock = FakeClock()
    told: list[Any] = []
    lease = held(clock, told=told)
    assert (lease.name, lease.fence) == (NAME, 7)
    assert lease.valid_until == pytest.approx(1000.0 + TTL - drift(TTL))
    clock.now = lease.valid_until - 0.001
    assert lease.remaining() == pytest.approx(0.001)
    assert not lease.lost()
    assert lease.reason is None
    lease.check()
    clock.now = lease.valid_until  # the very end is no longer valid
    assert lease.remaining() == 0.0
    assert lease.lost()
    assert lease.reason == "its validity ran out"
    assert told == [lease]
    with pytest.raises(redlease.LockLost, match="'orders:42' was lost: its validity ran out"):
        lease.check()
    assert told == [lease]  # looked at again: not told again


def test_the_first_loss_is_told_once_and_its_reason_stands() -> None:
    told: list[Any] = []
    lease = held(FakeClock(), told=told)
    unwatched: list[int] = []
    lease.watched(lambda: unwatched.append(1))
    meter = metered(lease)
    assert lease.mark_lost("taken over") is True
    assert lease.mark_lost("expired") is False
    lease.mark_released()  # a release after the loss changes nothing
    assert lease.lost()
    assert lease.status != _lease.RELEASED
    assert lease.reason == "taken over"
    assert told == [lease]
    assert unwatched == [1]  # its renewal stops, once
    assert meter.ends == [(5.0, True)]
    assert not lease.is_held()


def test_an_on_lost_callback_that_raises_is_logged_and_the_loss_still_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(lease: Any) -> None:
        raise RuntimeError("the holder's own bug")

    s = spec(FakeClock())
    lease = _lease.LeaseState(s, grant(s), broken)
    with caplog.at_level(logging.ERROR, logger="redlease._rules.lease"):
        assert lease.mark_lost("taken over") is True
    assert lease.reason == "taken over"
    assert "on_lost callback for lock 'orders:42'" in caplog.text


def test_a_released_lease_is_neither_valid_nor_ever_lost() -> None:
    clock = FakeClock()
    told: list[Any] = []
    lease = held(clock, told=told)
    lease.mark_released()
    assert lease.remaining() == 0.0  # with time left on the clock
    assert lease.hold_count() == 0
    clock.advance(TTL)
    assert lease.status == _lease.RELEASED
    assert not lease.lost()
    assert lease.reason is None
    with pytest.raises(redlease.LockLost, match="'orders:42' was released"):
        lease.check()
    assert lease.mark_lost("taken over") is False
    assert told == []


def test_a_renewal_moves_validity_only_while_the_lease_is_held() -> None:
    clock = FakeClock()
    lease = held(clock)
    lease.renewed(1010.0)
    clock.now = 1005.0  # past the first validity, within the renewed one
    assert not lease.lost()
    assert lease.remaining() == pytest.approx(5.0)
    lease.mark_released()
    lease.renewed(1020.0)
    lost = held(clock)
    lost.mark_lost("taken over")
    before = lost.valid_until
    lost.renewed(1020.0)
    assert (lease.valid_until, lost.valid_until) == (1010.0, before)


def test_hold_count_counts_a_reentrant_leases_holds_while_it_is_held() -> None:
    lease = held(FakeClock())
    assert lease.hold_count() == 1
    lease.hold_again()
    lease.hold_again()
    lease.drop_hold()  # a hold given up before its caller had it
    assert lease.hold_count() == 2
    lease.mark_lost("taken over")
    assert (lease.hold_count(), lease.holds) == (0, 2)  # the holds are still to release
    # what an interrupted block's end reads to tell whether its release began
    lease.release_calls += 1
    assert (_lease.release_calls(lease), _lease.release_calls(object())) == (1, 0)


def test_in_a_forks_child_a_lease_reads_as_lost_untold_and_refuses_to_be_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    told: list[Any] = []
    lease = held(FakeClock(), told=told)
    unwatched: list[int] = []
    lease.watched(lambda: unwatched.append(1))
    holders, acquired, me = _lease.Holders(), _lease.HandedOut(), Holder()
    holders.hold(me, lease)
    acquired.note(me, lease)
    lease.not_forked()  # the process that acquired it may release it
    monkeypatch.setattr(_fork, "generation", _fork.generation + 1)
    assert holders.held(me) is None
    assert acquired.tokens(me) == set()
    with pytest.raises(redlease.LockLost, match="belongs to the process this one was forked from"):
        lease.not_forked()
    assert lease.lost()
    assert lease.reason == "this process is a fork of the one that holds it"
    assert told == []  # the child never held it
    assert unwatched == []  # the parent's renewer is not the child's to stop


def test_after_a_fork_the_renewers_leases_are_dropped_and_read_as_lost_untold() -> None:
    clock = FakeClock()
    told: list[Any] = []
    schedule = _renewal.Schedule()
    leases = [held(clock, told=told), held(clock, told=told)]
    for lease in leases:
        watch(schedule, lease, Driver(object()))
    for renewal in schedule.clear():
        renewal.lease.forked()
    assert len(schedule) == 0
    assert [lease.reason for lease in leases] == [
        "this process is a fork of the one that holds it"
    ] * 2
    assert told == []


def test_metrics_record_the_end_of_a_hold_once_released_or_lost() -> None:
    clock = FakeClock()
    released, lost, unhanded = held(clock), held(clock), held(clock)
    meters = [metered(lease) for lease in (released, lost, unhanded)]
    labels: Any = released.labels
    assert labels is meters[0]
    released.mark_released()
    lost.mark_lost("taken over")
    unwatched: list[int] = []
    unhanded.watched(lambda: unwatched.append(1))
    unhanded.mark_released()  # never reached its caller: released here, its watch ended
    for lease in (released, lost, unhanded):  # later news changes nothing
        lease.mark_lost("expired")
        lease.mark_released()
    assert [meter.ends for meter in meters] == [[(5.0, False)], [(5.0, True)], [(5.0, False)]]
    assert unhanded.status == _lease.RELEASED
    assert unwatched == [1]


# -- the extend and release flows a lease gives -------------------------------------------


def test_a_lease_extends_by_its_own_token_and_counts_validity_from_the_send() -> None:
    clock = FakeClock()
    lease = held(clock)
    flow = lease.extend_flow(5000, wait=0.4)
    op = next(flow)
    assert isinstance(op, _ops.Call)
    assert op.script is _scripts.EXTEND
    assert (op.keys, op.args, op.timeout) == (("redlease:{orders:42}",), (lease.token, "5000"), 0.4)
    clock.advance(0.3)  # the reply's time in flight is the lease's loss
    assert step(flow, 1) == ("done", pytest.approx(1000.0 + 5.0 - drift(5.0)))
    # without the renewer's bound, the lock's own (its ttl, as it is longer than 1 s)
    assert next(lease.extend_flow(5000)).timeout == TTL


def test_an_extend_that_finds_the_lease_gone_marks_it_lost_and_a_failed_one_does_not() -> None:
    told: list[Any] = []
    lease = held(FakeClock(), told=told)
    flow = lease.extend_flow(3000)
    next(flow)
    with pytest.raises(redlease.BackendError), lease.lost_on_lock_lost():
        flow.throw(failure("extend"))
    assert lease.is_held()  # the server out of reach says nothing of the lease
    assert told == []
    flow = lease.extend_flow(3000)
    next(flow)
    with pytest.raises(redlease.LockLost) as gone, lease.lost_on_lock_lost():
        flow.send(0)
    assert str(gone.value) == LOST_WORDS
    assert lease.reason == LOST_WORDS
    assert told == [lease]


def test_an_extend_without_a_ttl_takes_the_locks_own_and_a_too_short_one_is_refused() -> None:
    lease = held(FakeClock())
    assert lease.extend_ttl_ms(None) == 3000
    assert lease.extend_ttl_ms(0.25) == 250
    with pytest.raises(redlease.InvalidArgument, match="ttl must be at least 3 ms"):
        lease.extend_ttl_ms(0.002)


def test_a_release_leaves_a_mark_as_long_as_its_retries_and_a_hurried_one_is_bounded() -> None:
    lease = held(FakeClock())
    unwatched: list[int] = []
    lease.watched(lambda: unwatched.append(1))
    op = next(lease.release_flow())
    assert isinstance(op, _ops.Call)
    assert op.script is _scripts.RELEASE
    assert op.keys == lease.spec.keys.script_keys
    # fair, the waiters' bells, a release mark as long as a reply is waited for (the ttl)
    assert op.args == (lease.token, "1", "redlease:{orders:42}:bell:", "3000")
    assert (op.timeout, op.patient) == (TTL, True)
    # given back in haste: its renewal stops first, once, and it is held until the reply
    lease.stop_watching()
    lease.stop_watching()
    assert unwatched == [1]
    assert lease.is_held()
    hurried = next(lease.release_flow(hurried=True))
    assert hurried.args == op.args
    assert (hurried.timeout, hurried.patient) == (_flows.PAST_DEADLINE, False)


def test_a_release_the_server_confirms_ends_the_hold_and_its_renewal() -> None:
    h = holding()
    flow = h.lease.release_flow()
    next(flow)
    with h.lease.releasing():
        assert step(flow, 1) == ("done", None)
    assert h.lease.status == _lease.RELEASED
    assert h.unwatched == [1]
    assert h.holders.held(h.holder) is None
    assert h.told == []


def test_a_release_that_finds_the_lease_gone_marks_it_lost_and_frees_its_holder() -> None:
    h = holding()
    flow = h.lease.release_flow()
    next(flow)
    with (
        pytest.raises(redlease.LockLost, match="had already expired or been taken over"),
        h.lease.releasing(),
    ):
        flow.send(0)
    assert h.lease.lost()
    assert h.told == [h.lease]
    assert h.unwatched == [1]
    # told by the error: the holder's next acquire is a new one, not a re-entry
    assert h.holders.held(h.holder) is None


def test_a_release_short_of_a_quorum_counts_as_released() -> None:
    h = holding()
    quorum = redlease.QuorumError("release 'orders:42': 1 of 3 nodes", {"b:6379": "refused"})
    with pytest.raises(redlease.QuorumError), h.lease.releasing():
        raise quorum
    assert h.lease.status == _lease.RELEASED
    assert h.unwatched == [1]


def test_a_release_that_fails_stops_renewal_and_lets_go_without_calling_it_released() -> None:
    h = holding()
    flow = h.lease.release_flow()
    next(flow)
    with pytest.raises(redlease.BackendError), h.lease.releasing():
        flow.throw(failure("release"))
    assert h.lease.is_held()  # it may still be held on the server, until its ttl
    assert h.lease.status != _lease.RELEASED
    assert h.unwatched == [1]
    assert h.holders.held(h.holder) is None
    assert h.told == []


def test_a_lease_lost_by_a_blocks_end_is_raised_only_if_the_block_succeeded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lease = held(FakeClock())
    lost = redlease.LockLost("lease on 'orders:42' was lost")
    with pytest.raises(redlease.LockLost) as raised:
        _lease.lost_at_block_end(lease, lost, None)
    assert raised.value is lost
    with caplog.at_level(logging.WARNING, logger="redlease._rules.lease"):
        _lease.lost_at_block_end(lease, lost, ValueError("the block's own error"))
    assert "was lost before the block that held it failed" in caplog.text


# -- the holders' tables ------------------------------------------------------------------


def test_a_holders_table_drops_released_leases_and_keeps_lost_ones_for_their_holder() -> None:
    clock = FakeClock()
    holders, me, you = _lease.Holders(), Holder(), Holder()
    mine, yours = held(clock), held(clock)
    holders.hold(me, mine)
    holders.hold(you, yours)
    assert (holders.held(me), holders.held(you), holders.held(Holder())) == (mine, yours, None)
    mine.mark_lost("taken over")
    assert holders.held(me) is mine  # its holder is told at its next use of it
    yours.mark_released()
    assert holders.held(you) is None
    # asyncio code run outside a task is no holder: it holds nothing, and keeps nothing
    holders.hold(None, held(clock))
    assert holders.held(None) is None
    holders.left(None, mine)


def test_a_lease_released_late_leaves_its_holders_newer_lease_in_the_table() -> None:
    clock = FakeClock()
    holders, me = _lease.Holders(), Holder()
    old, new = held(clock), held(clock)
    holders.hold(me, old)
    holders.hold(me, new)
    old.mark_released()
    assert holders.held(me) is new
    holders.left(me, old)
    assert holders.held(me) is new
    holders.left(me, new)
    assert holders.held(me) is None


def test_a_holders_table_keeps_no_holder_alive() -> None:
    holders, me, lease = _lease.Holders(), Holder(), held(FakeClock())
    holders.hold(me, lease)
    gone = weakref.ref(me)
    del me
    gc.collect()
    assert gone() is None
    lease.mark_released()  # leaving the table of a holder that is gone
    assert lease.status == _lease.RELEASED


def test_acquired_tokens_are_a_holders_leases_it_still_holds() -> None:
    clock = FakeClock()
    acquired, me, you = _lease.HandedOut(), Holder(), Holder()
    kept, released, lost = held(clock), held(clock), held(clock)
    short = held(clock, ttl=0.5)
    for lease in (kept, released, lost, short):
        acquired.note(me, lease)
    yours = held(clock)
    acquired.note(you, yours)
    acquired.note(None, held(clock))  # asyncio code outside a task: nobody to own it
    released.mark_released()
    lost.mark_lost("taken over")
    clock.advance(0.5)  # the short lease has run out, though nobody has looked yet
    assert acquired.tokens(me) == {kept.token}
    assert acquired.tokens(you) == {yours.token}
    assert acquired.tokens(Holder()) == set()
    assert acquired.tokens(None) == set()  # (asked outside a task: nobody owns anything)
    token = yours.token
    del yours  # the table keeps no lease alive
    gc.collect()
    assert token not in acquired.tokens(you)


# -- the renewal schedule -----------------------------------------------------------------


def test_the_holder_is_told_two_hundredths_of_the_ttl_early_and_25_ms_at_most() -> None:
    assert _renewal.notice_lead(0.5) == pytest.approx(0.01)
    assert _renewal.notice_lead(1.25) == pytest.approx(0.025)
    assert _renewal.notice_lead(30.0) == 0.025


def test_a_lease_is_due_a_third_of_its_ttl_after_the_send_and_rides_along_a_sixth_early() -> None:
    clock = FakeClock()
    schedule = _renewal.Schedule()
    assert schedule.next_wakeup() is None
    renewal = watch(schedule, held(clock), Driver(object()))
    # a third of the ttl after the acquire was sent (its validity is then 2/3 of the ttl)
    assert renewal.due == pytest.approx(1000.0 + TTL / 3 - drift(TTL))
    assert schedule.next_wakeup() == renewal.due
    assert schedule.next_wakeup(renewing=False) == renewal.notice_at
    joins_at = renewal.due - TTL / 6
    assert schedule.take_due(joins_at - 0.001) == []
    [batch] = schedule.take_due(joins_at)
    assert batch.renewals == [renewal]


def test_renewal_stops_at_max_hold_and_then_only_the_notice_is_awaited() -> None:
    clock = FakeClock()
    schedule = _renewal.Schedule()
    # stops at 1000.9, before it is due (1000.968) but after it may ride along (1000.468)
    renewal = watch(schedule, held(clock), Driver(object()), max_hold=0.9)
    assert schedule.next_wakeup() == renewal.notice_at
    assert [batch.renewals for batch in schedule.take_due(1000.9 - 0.001)] == [[renewal]]
    assert schedule.take_due(1000.9) == []
    assert schedule.take_due(renewal.due) == []


def test_due_renewals_go_in_one_batch_per_client_and_apart_with_replicas() -> None:
    clock = FakeClock()
    schedule = _renewal.Schedule()
    shared, bare = object(), object()  # a driver without a client of its own is its own
    a = watch(schedule, held(clock), Driver(shared))
    b = watch(schedule, held(clock), Driver(shared))
    c = watch(schedule, held(clock), Driver(object()))
    r = watch(schedule, held(clock, replicas=1), Driver(shared))
    d = watch(schedule, held(clock), bare)
    e = watch(schedule, held(clock), bare)
    batches = schedule.take_due(a.due)
    assert [batch.renewals for batch in batches] == [[a, b], [c], [r], [d, e]]
    assert batches[0].io is a.io


def test_a_reply_is_awaited_a_third_of_the_ttl_and_never_past_another_leases_notice() -> None:
    clock = FakeClock()
    schedule = _renewal.Schedule()
    lease = held(clock)
    a = watch(schedule, lease, Driver(object()))
    [batch] = schedule.take_due(a.due)
    [op], wait = schedule.start(batch, a.due)
    assert wait == pytest.approx(TTL / 3)
    assert isinstance(op, _ops.Call)
    assert op.script is _scripts.EXTEND
    assert (op.args, op.timeout) == ((lease.token, "3000"), wait)
    clock.advance(0.5)
    b = watch(schedule, held(clock, ttl=0.5, replicas=1), Driver(object()))
    batch_a, batch_b = schedule.take_due(a.due)
    _, wait = schedule.start(batch_a, a.due)
    assert wait == pytest.approx(b.notice_at - a.due)  # 15 ms: b's holder is told in time
    [op], _ = schedule.start(batch_b, a.due)
    assert op.replicas == _ops.Replicas(1, 15)  # their wait is cut to it too (from 50 ms)
    _, wait = schedule.start(batch_a, b.notice_at + 0.1)
    assert wait == SHORTEST_WAIT  # never 0 (or forever) for the driver


def test_a_lease_released_meanwhile_is_neither_renewed_nor_revived() -> None:
    clock = FakeClock()
    schedule = _renewal.Schedule()
    before = held(clock)
    renewal = watch(schedule, before, Driver(object()))
    [batch] = schedule.take_due(renewal.due)
    before.mark_released()
    steps, _ = schedule.start(batch, renewal.due)
    assert (steps, batch.renewals) == ([], [])
    during = held(clock)
    renewal = watch(schedule, during, Driver(object()))
    [batch] = schedule.take_due(renewal.due)
    schedule.start(batch, renewal.due)
    during.mark_released()  # while its renewal is in flight
    valid_until = during.valid_until
    assert schedule.settle(batch, [1], renewal.due) == []
    assert during.status == _lease.RELEASED
    assert during.valid_until == valid_until


def test_each_renewal_in_a_batch_is_settled_by_its_own_reply() -> None:
    clock = FakeClock()
    schedule = _renewal.Schedule()
    told: list[Any] = []
    io = Driver(object())
    kept, gone, failing = held(clock, told=told), held(clock, told=told), held(clock, told=told)
    renewals = [watch(schedule, lease, io) for lease in (kept, gone, failing)]
    sent_at = clock.now = renewals[0].due
    [batch] = schedule.take_due(sent_at)
    steps, _ = schedule.start(batch, sent_at)
    assert [op.args[0] for op in steps] == [kept.token, gone.token, failing.token]
    clock.advance(0.4)  # slow replies
    losses = schedule.settle(batch, [1, 0, failure("renew")], clock())
    # renewed: its validity counts from the send, not from the reply
    assert kept.valid_until == pytest.approx(sent_at + TTL - drift(TTL))
    assert renewals[0].retry_at is None
    # tried again later, its validity as it was
    assert renewals[2].retry_at is not None
    assert failing.valid_until == pytest.approx(1000.0 + TTL - drift(TTL))
    # lost: off the schedule at once, its holder told by tell(), not by settle()
    assert losses == [(gone, LOST_WORDS)]
    assert len(schedule) == 2
    assert told == []
    _renewal.tell(losses)
    assert told == [gone]
    assert gone.reason == LOST_WORDS
    assert kept.is_held()
    assert failing.is_held()


def test_a_failed_renewal_is_retried_after_a_quarter_of_the_validity_left_until_one_lands() -> None:
    clock = FakeClock()
    schedule = _renewal.Schedule()
    lease = held(clock)
    renewal = watch(schedule, lease, Driver(object()))
    now = renewal.due
    [batch] = schedule.take_due(now)
    steps, _ = schedule.start(batch, now)
    assert schedule.settle(batch, _renewal.failed(failure("renew"), len(steps)), now) == []
    retry_at = renewal.retry_at
    assert retry_at == pytest.approx(now + (lease.valid_until - now) / 4)
    assert retry_at is not None
    assert schedule.next_wakeup() == retry_at
    assert schedule.take_due(retry_at - 0.001) == []  # a retry rides along with none
    [batch] = schedule.take_due(retry_at)
    # 20 ms left: a quarter of it (5 ms) is less than the floor
    late = lease.valid_until - 0.02
    steps, _ = schedule.start(batch, late)
    schedule.settle(batch, _renewal.failed(failure("renew"), len(steps)), late)
    retry_at = renewal.retry_at
    assert retry_at == pytest.approx(late + _renewal.RETRY_FLOOR)
    assert retry_at is not None
    # one that lands puts the lease back on the ordinary schedule
    clock.now = retry_at
    [batch] = schedule.take_due(retry_at)
    schedule.start(batch, retry_at)
    assert schedule.settle(batch, [1], retry_at) == []
    assert renewal.retry_at is None
    assert renewal.due == pytest.approx(retry_at + TTL / 3 - drift(TTL))


@pytest.mark.parametrize(
    ("options", "reply", "words", "logged"),
    [
        ({"replicas": 1}, (1, 0), "only 0 of 1 replicas acknowledged it", False),
        ({}, b"OK", "invalid literal for int()", True),  # no reply EXTEND gives
    ],
)
def test_too_few_acknowledgements_or_an_unreadable_reply_is_a_failed_renewal_not_a_loss(
    caplog: pytest.LogCaptureFixture, options: dict[str, Any], reply: Any, words: str, logged: bool
) -> None:
    clock = FakeClock()
    schedule = _renewal.Schedule()
    lease = held(clock, **options)
    meter = metered(lease)
    renewal = watch(schedule, lease, Driver(object()))
    [batch] = schedule.take_due(renewal.due)
    schedule.start(batch, renewal.due)
    with caplog.at_level(logging.ERROR, logger="redlease._rules.renewal"):
        assert schedule.settle(batch, [reply], renewal.due) == []
    assert renewal.retry_at is not None
    assert lease.is_held()
    [error] = meter.renewal_failures
    assert words in str(error)
    assert ("unexpected reply renewing 'orders:42'" in caplog.text) == logged


def test_a_lease_is_given_up_at_its_notice_before_validity_ends_saying_why() -> None:
    clock = FakeClock()
    schedule = _renewal.Schedule()
    unconfirmed, failing, capped = held(clock), held(clock), held(clock)
    watch(schedule, unconfirmed, Driver(object()))
    retried = watch(schedule, failing, Driver(object()))
    watch(schedule, capped, Driver(object()), max_hold=0.9)
    [batch] = [batch for batch in schedule.take_due(retried.due) if batch.renewals == [retried]]
    schedule.start(batch, retried.due)
    schedule.settle(batch, [failure("renew")], retried.due)
    notice = unconfirmed.valid_until - 0.025
    assert schedule.expire(notice - 0.001) == []
    clock.now = notice
    assert dict(schedule.expire(notice)) == {
        unconfirmed: "its validity ran out before a renewal was confirmed",
        failing: "renewals failed until its validity ran out",
        capped: "renewal stopped at max_hold and its validity ran out",
    }
    assert len(schedule) == 0
    # told before the end: the holder still has its last few milliseconds
    assert [lease.remaining() for lease in (unconfirmed, failing, capped)] == [
        pytest.approx(0.025)
    ] * 3


def test_leases_no_longer_held_leave_the_schedule_without_a_word() -> None:
    clock = FakeClock()
    schedule = _renewal.Schedule()
    released, lost = held(clock), held(clock)
    for lease in (released, lost):
        schedule.add(lease, Driver(object()), clock(), None)  # (not unwatched when they end)
    released.mark_released()
    lost.mark_lost("taken over")
    assert schedule.expire(clock()) == []
    assert len(schedule) == 0


def test_the_holder_is_told_once_whoever_finds_the_loss_first() -> None:
    clock = FakeClock()
    schedule = _renewal.Schedule()
    told: list[Any] = []
    seen_first, told_first = held(clock, told=told), held(clock, told=told)
    for lease in (seen_first, told_first):
        watch(schedule, lease, Driver(object()))
    losses = dict(schedule.expire(seen_first.valid_until - 0.025))
    clock.now = seen_first.valid_until
    assert seen_first.lost()  # its holder looks before the renewer tells it
    _renewal.tell([(seen_first, losses[seen_first])])
    _renewal.tell([(told_first, losses[told_first])])
    assert told_first.lost()  # its holder looks after
    assert told == [seen_first, told_first]
    assert seen_first.reason == "its validity ran out"
    assert told_first.reason == "its validity ran out before a renewal was confirmed"


def test_telling_one_holder_that_fails_still_tells_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    told: list[Any] = []
    first, second = held(clock, told=told), held(clock, told=told)
    metered(first, broken=True)
    with caplog.at_level(logging.ERROR, logger="redlease._rules.renewal"):
        _renewal.tell([(first, "taken over"), (second, "expired")])
    assert "telling the holder of 'orders:42' about its loss failed" in caplog.text
    assert first.lost()
    assert second in told
    assert second.reason == "expired"
