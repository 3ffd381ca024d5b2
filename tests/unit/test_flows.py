"""The sans-IO core, driven by hand with scripted replies and a fake clock: no server,
no sleeping. These pin the rules every driver inherits."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

import redlease
from redlease._base import timing as _timing
from redlease._base.timing import Deadline, drift
from redlease._rules import flows as _flows
from redlease._rules import ops as _ops
from redlease._rules import scripts as _scripts
from redlease._rules.keys import LockKeys, hash_tag
from redlease._rules.lease import LeaseState
from redlease._rules.settings import SETTINGS_WAIT
from redlease.testing import FakeClock


def spec(clock: FakeClock, ttl: float = 10.0, fair: bool = True) -> _flows.LockSpec:
    return _flows.LockSpec.create("orders:42", ttl, fair=fair, clock=clock)


def first_op(flow: Generator[Any, Any, Any]) -> Any:
    """The flow's first op on the server: a waiter's Listen is answered as by a driver
    without a hub (its waits are then on its own bell)."""
    op = next(flow)
    return flow.send(None) if isinstance(op, _ops.Listen) else op


def step(flow: Generator[Any, Any, Any], reply: Any) -> Any:
    """Send a reply; return the next op, or ('done', value) when the flow ends."""
    try:
        return flow.send(reply)
    except StopIteration as stop:
        return ("done", stop.value)


def test_acquire_is_one_script_call_and_validity_counts_from_before_sending() -> None:
    clock = FakeClock()
    attempt = _flows.Acquisition(spec(clock), None, wait=False)
    flow = attempt.run()
    op: Any = first_op(flow)
    assert isinstance(op, _ops.Call)
    assert op.script is _scripts.ACQUIRE
    assert op.keys == (
        "redlease:{orders:42}",
        "redlease:{orders:42}:fence",
        "redlease:{orders:42}:line",
    )
    token, ttl_ms, fair, queue_ms, bells, holds, hub, place, landing_ms = op.args
    assert token == attempt.token
    assert len(token) == 32
    assert (ttl_ms, fair, queue_ms, bells) == ("10000", "1", "0", "redlease:{orders:42}:bell:")
    assert holds == "1"  # one fence per grant
    assert hub == ""  # a try that does not queue names no hub
    assert place == ""  # a first try has no place in the queue
    assert landing_ms == attempt.spec.given_up_ms  # how late a try of it may land
    clock.advance(0.3)  # time in flight is the holder's loss
    done, grant = step(flow, [7, 10000, 1_000_000, 1, ""])
    assert done == "done"
    assert grant.fence == 7
    assert grant.valid_until == pytest.approx(1000.0 + 10.0 - drift(10.0))


def test_busy_lock_without_waiting_gives_none() -> None:
    flow = _flows.Acquisition(spec(FakeClock()), None, wait=False).run()
    first_op(flow)
    assert step(flow, [0, 4000, 1_000_000, 0, ""]) == ("done", None)


def test_a_reply_too_late_to_be_useful_is_given_back() -> None:
    clock = FakeClock()
    attempt = _flows.Acquisition(spec(clock, ttl=1.0), 10.0, wait=True)
    flow = attempt.run()
    first_token = attempt.token
    first_op(flow)
    clock.advance(2.0)  # paused past the whole ttl before the reply was read
    leave = step(flow, [3, 1000, 1_000_000, 1, ""])
    assert leave.script is _scripts.LEAVE
    assert leave.args[0] == first_token
    assert leave.args[3] == "0"  # release what was granted
    retry = step(flow, [0, 0, 0])  # time is left: try again, with a new token
    assert retry.script is _scripts.ACQUIRE
    assert retry.args[0] != first_token


def test_try_acquire_makes_one_attempt_however_late_its_grant() -> None:
    clock = FakeClock()
    flow = _flows.Acquisition(spec(clock, ttl=1.0), 0.0, wait=False).run()
    first_op(flow)
    clock.advance(2.0)
    leave = step(flow, [3, 1000, 1_000_000, 1, ""])
    assert leave.script is _scripts.LEAVE
    assert step(flow, [0, 0, 0]) == ("done", None)  # given back, and no second attempt


@pytest.mark.parametrize("via", ["reply", "bell"])
def test_late_grants_do_not_outlast_the_deadline(via: str) -> None:
    """A round trip longer than the validity makes every grant late: the attempt still
    ends at its deadline, not after however many late grants come."""
    clock = FakeClock()
    flow = _flows.Acquisition(spec(clock, ttl=0.2), 0.5, wait=True).run()
    op: Any = first_op(flow)
    sent = 0
    while op != ("done", None):
        assert sent < 10, "still trying long past the deadline"
        if isinstance(op, _ops.Wait):  # queued, then handed the lock by a release
            op = step(flow, f"{sent}:1000000:1".encode())
        elif op.script is _scripts.ACQUIRE:
            sent += 1
            clock.advance(0.24)  # the round trip: longer than 0.2 s less drift
            op = step(
                flow,
                [sent, 200, 1_000_000, 1, ""] if via == "reply" else [0, 100, 1_000_000, 0, ""],
            )
        else:
            assert op.script is _scripts.LEAVE
            op = step(flow, [0, 0, 0])
    assert sent >= 2  # time was left after the first late grant
    assert clock() - 1000.0 < 0.5 + 2 * 0.24  # the deadline, plus the attempt under way


def test_wait_for_replicas_is_cut_to_the_time_the_deadline_leaves() -> None:
    clock = FakeClock()
    s = _flows.LockSpec.create("orders:42", 30.0, clock=clock, replicas=1)
    assert s.replicas == _ops.Replicas(1, 3000)  # a tenth of the ttl by default
    flow = _flows.Acquisition(s, 0.0035, wait=True).run()
    op: Any = first_op(flow)
    assert op.replicas == _ops.Replicas(1, 3)  # whole ms, rounded down
    clock.advance(0.003)
    wait = step(flow, [[0, 9000, 5_000_000, 0, ""], 1])
    assert isinstance(wait, _ops.Wait)
    assert wait.replicas == _ops.Replicas(1, 1)  # 0 would mean "forever" to WAIT
    clock.advance(0.001)
    leave = step(flow, (None, 0))
    assert leave.script is _scripts.LEAVE
    assert leave.replicas == _ops.Replicas(1, 1)
    assert step(flow, [[0, 0, 0], 0]) == ("done", None)
    # no deadline, or one try: the whole WAIT
    for timeout, wait in ((None, True), (0.0, False)):
        first: Any = next(_flows.Acquisition(s, timeout, wait=wait).run())
        assert first.replicas == s.replicas


def test_giving_back_with_replicas_does_not_wait_for_them() -> None:
    clock = FakeClock()
    s = _flows.LockSpec.create("orders:42", 1.0, clock=clock, replicas=1)
    flow = _flows.Acquisition(s, 10.0, wait=True).run()
    first_op(flow)
    clock.advance(2.0)
    leave = step(flow, [[3, 1000, 1_000_000, 1, ""], 1])  # too late
    assert leave.script is _scripts.LEAVE
    assert leave.replicas is None
    assert step(flow, [0, 0, 0]).script is _scripts.ACQUIRE  # a plain reply: no TypeError


def test_extend_with_replicas_counts_only_when_acknowledged() -> None:
    clock = FakeClock()
    s = _flows.LockSpec.create("orders:42", 3.0, clock=clock, replicas=1)
    flow = _flows.extend(s, "tok", 3000, wait=0.05)  # as the renewer sends it
    op: Any = first_op(flow)
    assert op.timeout == 0.05
    assert op.replicas == _ops.Replicas(1, 50)
    assert step(flow, (1, 1))[0] == "done"
    flow = _flows.extend(s, "tok", 3000)
    op = first_op(flow)
    assert op.replicas == s.replicas
    with pytest.raises(redlease.BackendError, match="only 0 of 1 replicas"):
        flow.send((1, 0))


def test_a_ttl_that_leaves_no_validity_is_refused() -> None:
    assert _flows.LockSpec.create("x", 0.003).ttl_ms == 3
    for ttl in (0.001, 0.002, 0.0019):
        with pytest.raises(redlease.InvalidArgument, match="ttl must be at least 3 ms"):
            _flows.LockSpec.create("x", ttl)


def test_waiter_sleeps_on_its_bell_until_the_holders_expiry_at_most() -> None:
    clock = FakeClock()
    attempt = _flows.Acquisition(spec(clock), 30.0, wait=True)
    flow = attempt.run()
    op: Any = first_op(flow)
    assert int(op.args[3]) >= 10_000  # queued, with an entry that outlives the wait
    wait = step(flow, [0, 2500, 5_000_000, 0, ""])
    assert isinstance(wait, _ops.Wait)
    assert wait.key == "redlease:{orders:42}:bell:" + attempt.token
    assert wait.timeout == pytest.approx(2.5 + _flows.EXPIRY_NUDGE)
    assert wait.give_up == pytest.approx(wait.timeout + _ops.LATE_WAKE)


def test_handover_validity_uses_only_server_elapsed_time() -> None:
    clock = FakeClock()
    flow = _flows.Acquisition(spec(clock), 30.0, wait=True).run()
    first_op(flow)
    clock.advance(0.01)
    step(flow, [0, 2500, 5_000_000, 0, ""])
    clock.advance(1.5)
    # granted 1.2 s (server time) after our acquire script ran
    done, grant = step(flow, b"8:6200000:1")
    assert done == "done"
    assert grant.fence == 8
    assert grant.valid_until == pytest.approx(1000.0 + 1.2 + 10.0 - drift(10.0))


def test_a_wake_up_without_grant_tries_again() -> None:
    clock = FakeClock()
    flow = _flows.Acquisition(spec(clock, fair=False), 30.0, wait=True).run()
    first_op(flow)
    step(flow, [0, 2500, 5_000_000, 0, ""])
    again = step(flow, b"0:5100000:0")
    assert again.script is _scripts.ACQUIRE


def test_a_waiter_sends_its_place_back_and_a_first_try_sent_twice_asks_for_a_search() -> None:
    """The script tells a queued try its place (its item in the queue): the next try and
    the leave send it back. A first try that may queue carries other arguments for a
    second send (its reply lost: the first may have queued): "?", its place searched
    for; after its reply was lost it is "?" too. A later try's place stays (the server
    searches for it when a first run of the try renewed it elsewhere)."""
    import redis

    clock = FakeClock()
    attempt = _flows.Acquisition(spec(clock, fair=False), 30.0, wait=True)
    flow = attempt.run()
    op: Any = first_op(flow)
    assert op.args[7] == ""  # a first try has none
    assert op.again == (*op.args[:7], _flows.UNKNOWN_PLACE, *op.args[8:])
    sleep = flow.throw(_failure(redis.ConnectionError("reset")))
    assert isinstance(sleep, _ops.Sleep)
    clock.advance(sleep.seconds)
    op = first_op(flow)
    assert op.args[7] == _flows.UNKNOWN_PLACE
    assert op.again is None
    step(flow, [0, 2500, 5_000_000, 0, "t|1"])
    op = step(flow, b"0:5100000:0")  # woken to compete
    assert op.script is _scripts.ACQUIRE
    assert op.args[7] == "t|1"
    assert op.again is None
    sleep = flow.throw(_failure(redis.ConnectionError("reset")))
    assert isinstance(sleep, _ops.Sleep)
    clock.advance(sleep.seconds)
    op = first_op(flow)
    assert op.args[7] == "t|1"
    step(flow, [0, 2500, 5_000_000, 0, "t|2"])
    clock.advance(30.0)
    leave = step(flow, None)
    assert leave.script is _scripts.LEAVE
    assert leave.args[5] == "t|2"


def test_a_grant_whose_attempt_had_a_try_unanswered_is_released_then_marked_given_up() -> None:
    """That try may still land (held up on a dropped connection): once the grant is
    released, a LEAVE marks the attempt given up, and the try takes nothing when it
    lands. A grant whose tries were all answered is released in one call."""
    import redis

    for failed in (True, False):
        clock = FakeClock()
        attempt = _flows.Acquisition(spec(clock), 30.0, wait=True)
        flow = attempt.run()
        first_op(flow)
        if failed:
            sleep = flow.throw(_failure(redis.ConnectionError("reset")))
            assert isinstance(sleep, _ops.Sleep)
            first_op(flow)
        done, grant = step(flow, [7, 10000, 1_000_000, 1, ""])
        assert done == "done"
        assert grant.unsure is failed
        release: Any = _flows.release(attempt.spec, grant.token, unsure=grant.unsure)
        assert next(release).script is _scripts.RELEASE
        after = step(release, 1)
        if failed:
            assert after.script is _scripts.LEAVE
            assert (after.args[0], after.args[3], after.args[5]) == (grant.token, "0", "?")
            assert step(release, [0, 0, 0]) == ("done", None)
        else:
            assert after == ("done", None)


def test_an_attempt_cut_short_with_a_queueing_try_unanswered_leaves_by_its_token() -> None:
    """Cancelled (or interrupted) while a try that may queue is in flight: the server may
    have queued it, so the leave asks for the token's place to be searched for."""
    clock = FakeClock()
    attempt = _flows.Acquisition(spec(clock), 30.0, wait=True)
    op: Any = first_op(attempt.run())
    assert op.args[3] != "0"  # a queueing try, sent; no reply read
    assert op.args[7] == ""
    leave: Any = next(attempt.abandon())
    assert leave.script is _scripts.LEAVE
    assert leave.args[5] == _flows.UNKNOWN_PLACE
    # a try that cannot queue leaves the place as it was
    attempt = _flows.Acquisition(spec(clock), None, wait=False)
    op = first_op(attempt.run())
    assert op.args[3] == "0"
    leave = next(attempt.abandon())
    assert leave.args[5] == ""


def test_deadline_leaves_the_queue_and_keeps_a_last_instant_grant() -> None:
    clock = FakeClock()
    attempt = _flows.Acquisition(spec(clock), 1.0, wait=True)
    flow = attempt.run()
    first_op(flow)
    wait = step(flow, [0, 9000, 5_000_000, 0, ""])
    assert wait.timeout == pytest.approx(1.0)  # the deadline, not the holder's 9 s
    clock.advance(1.0)
    leave = step(flow, None)
    assert leave.script is _scripts.LEAVE
    assert leave.args[3] == "1"  # keep a grant that raced the timeout
    _done, grant = step(flow, [11, 9500, 1])
    assert grant.fence == 11
    assert grant.token == attempt.token


def test_deadline_without_grant_ends_in_none() -> None:
    clock = FakeClock()
    flow = _flows.Acquisition(spec(clock), 0.5, wait=True).run()
    first_op(flow)
    step(flow, [0, 9000, 5_000_000, 0, ""])
    clock.advance(0.6)
    step(flow, None)
    assert step(flow, [0, 0, 0]) == ("done", None)


def test_zero_timeout_is_a_single_try_that_does_not_queue() -> None:
    flow = _flows.Acquisition(spec(FakeClock()), 0.0, wait=True).run()
    op: Any = first_op(flow)
    assert op.args[3] == "0"
    assert step(flow, [0, 9000, 5_000_000, 0, ""]) == ("done", None)


def test_extend_and_release_raise_lock_lost_when_not_ours() -> None:
    clock = FakeClock()
    s = spec(clock)
    flow = _flows.extend(s, "tok", 5000)
    op: Any = first_op(flow)
    assert op.script is _scripts.EXTEND
    assert op.keys == ("redlease:{orders:42}",)
    clock.advance(0.2)
    _done, until = step(flow, 1)
    assert until == pytest.approx(1000.0 + 5.0 - drift(5.0))
    flow = _flows.extend(s, "tok", 5000)
    first_op(flow)
    with pytest.raises(redlease.LockLost):
        flow.send(0)
    release = _flows.release(s, "tok")
    next(release)
    with pytest.raises(redlease.LockLost):
        release.send(0)


def test_lease_state_with_a_fake_clock() -> None:
    clock = FakeClock()
    s = spec(clock, ttl=2.0)
    seen: list[Any] = []
    state = LeaseState(s, _flows.Grant("tok", 3, 1001.5), on_lost=seen.append)
    lease = redlease.Lease(state, io=None)  # type: ignore[arg-type]
    assert lease.remaining() == pytest.approx(1.5)
    assert not lease.lost
    clock.advance(1.5)
    assert lease.remaining() == 0.0
    assert lease.lost
    assert lease.lost
    assert seen == [lease]  # told once
    with pytest.raises(redlease.LockLost):
        lease.check()


def test_keys_share_one_hash_tag() -> None:
    keys = LockKeys.for_name("a:b", prefix="app:")
    assert keys.lock == "app:{a:b}"
    assert keys.fence == "app:{a:b}:fence"
    assert keys.bell("t") == "app:{a:b}:bell:t"
    odd = LockKeys.for_name("}x{")
    tag = hash_tag("}x{")
    assert tag == "{%7Dx%7B}"  # the name's own braces escaped: the tag is the whole name
    assert all(k.startswith("redlease:" + tag) for k in odd.script_keys)


def test_deadline_and_backoff() -> None:
    clock = FakeClock()
    deadline = Deadline.after(clock, 2.0)
    assert deadline.cap(5.0) == 2.0
    clock.advance(1.5)
    assert deadline.left() == pytest.approx(0.5)
    assert not deadline.expired()
    clock.advance(1.0)
    assert deadline.expired()
    assert deadline.left() == 0.0
    assert Deadline.after(clock, None).cap(3.0) == 3.0


def _failure(cause: BaseException) -> redlease.BackendError:
    from redlease._wire.errors import backend_error

    return backend_error(cause, "acquire")


def test_a_wait_with_time_left_waits_out_a_failure_that_may_pass() -> None:
    """The server unreachable (a failover, a restart): a wait with time left tries again
    after a random delay, with the same token; past its deadline the failure is raised."""
    import redis

    clock = FakeClock()
    attempt = _flows.Acquisition(spec(clock), 2.0, wait=True)
    flow = attempt.run()
    first = first_op(flow)
    assert isinstance(first, _ops.Call)
    pauses = 0
    while True:
        try:
            op = flow.throw(_failure(redis.ConnectionError("refused")))
        except redlease.BackendError:
            break
        assert isinstance(op, _ops.Sleep)
        assert 0 < op.seconds <= _timing.PASSING_RETRY_CAP
        pauses += 1
        clock.advance(op.seconds)
        again = first_op(flow)
        assert isinstance(again, _ops.Call)
        assert again.script is _scripts.ACQUIRE
        assert again.args[0] == first.args[0]  # a try that did land is found
    assert pauses >= 3
    assert clock() >= 1002.0  # not before the deadline


@pytest.mark.parametrize(
    ("timeout", "wait", "cause"),
    [
        (None, True, "refused"),  # no deadline: the client's retries decided
        (0.0, False, "refused"),  # try_acquire: one attempt
        (5.0, True, "readonly"),  # not a failure that passes by itself
    ],
)
def test_other_failures_are_raised_at_once(timeout: float | None, wait: bool, cause: str) -> None:
    import redis

    error = redis.ConnectionError("refused") if cause == "refused" else redis.ReadOnlyError("x")
    flow = _flows.Acquisition(spec(FakeClock()), timeout, wait=wait).run()
    first_op(flow)
    with pytest.raises(redlease.BackendError):
        flow.throw(_failure(error))


class FakeBox:
    """A hub's box as the flow sees it: ``ready`` once the hub listens on the channel,
    ``pending`` while its SUBSCRIBE (another waiter's) is on its way."""

    def __init__(self, token: str, ready: bool, pending: bool = False) -> None:
        self.token, self.hub, self.ready, self.pending = token, "ab12", ready, pending

    def put(self, ring: bytes | None) -> None:
        raise AssertionError("the flow never rings a box")


def test_a_waiter_with_a_hub_tries_first_then_listens_then_queues_naming_its_hub() -> None:
    attempt = _flows.Acquisition(spec(FakeClock()), 30.0, wait=True)
    flow = attempt.run()
    listen: Any = next(flow)
    assert isinstance(listen, _ops.Listen)
    assert (listen.prefix, listen.token, listen.box) == (
        "redlease:{orders:42}:bell:",
        attempt.token,
        None,
    )
    box = FakeBox(attempt.token, ready=False)
    op: Any = step(flow, box)
    assert op.script is _scripts.ACQUIRE
    assert op.args[3] == "0"
    assert op.args[6] == ""
    subscribe = step(flow, [0, 4000, 1_000_000, 0, ""])
    assert isinstance(subscribe, _ops.Listen)
    assert subscribe.box is box
    box.ready = True
    op = step(flow, box)
    assert op.script is _scripts.ACQUIRE
    assert op.args[3] != "0"
    assert op.args[6] == "ab12"
    wait = step(flow, [0, 4000, 1_000_000, 0, ""])
    assert isinstance(wait, _ops.Wait)
    assert wait.box is box
    done, grant = step(flow, b"9:1000500:1")
    assert done == "done"
    assert grant.fence == 9


def test_a_waiter_whose_lock_is_being_subscribed_listens_then_queues_without_a_try() -> None:
    """Another waiter's SUBSCRIBE for this lock is on its way: the lock is waited for, so
    a try would only fail; the waiter waits for the hub to listen, then queues."""
    attempt = _flows.Acquisition(spec(FakeClock()), 30.0, wait=True)
    flow = attempt.run()
    next(flow)
    box = FakeBox(attempt.token, ready=False, pending=True)
    subscribe: Any = step(flow, box)
    assert isinstance(subscribe, _ops.Listen)
    assert subscribe.box is box
    box.ready, box.pending = True, False
    op: Any = step(flow, box)
    assert op.script is _scripts.ACQUIRE
    assert op.args[3] != "0"
    assert op.args[6] == "ab12"


def test_a_waiter_whose_hub_listens_already_queues_at_once() -> None:
    attempt = _flows.Acquisition(spec(FakeClock()), 30.0, wait=True)
    flow = attempt.run()
    next(flow)
    op: Any = step(flow, FakeBox(attempt.token, ready=True))
    assert op.args[3] != "0"
    assert op.args[6] == "ab12"


def test_a_hub_lost_while_waiting_means_a_look_at_the_lock_then_listening_again() -> None:
    attempt = _flows.Acquisition(spec(FakeClock()), 30.0, wait=True)
    flow = attempt.run()
    next(flow)
    box = FakeBox(attempt.token, ready=True)
    step(flow, box)
    wait: Any = step(flow, [0, 4000, 1_000_000, 0, ""])
    assert isinstance(wait, _ops.Wait)
    box.ready = False  # the hub's connection failed: the box gives None
    op: Any = step(flow, None)
    assert op.script is _scripts.ACQUIRE
    assert op.args[3] == "0"
    assert isinstance(step(flow, [0, 4000, 1_000_000, 0, ""]), _ops.Listen)  # listening again


def test_a_hub_refused_by_the_server_leaves_the_waiter_on_its_bell() -> None:
    attempt = _flows.Acquisition(spec(FakeClock()), 30.0, wait=True)
    flow = attempt.run()
    next(flow)
    box = FakeBox(attempt.token, ready=False)
    step(flow, box)
    step(flow, [0, 4000, 1_000_000, 0, ""])  # the try failed: the flow asks to listen
    op: Any = step(flow, None)  # refused (no channel rights)
    assert op.script is _scripts.ACQUIRE
    assert op.args[3] != "0"
    assert op.args[6] == ""
    wait = step(flow, [0, 4000, 1_000_000, 0, ""])
    assert isinstance(wait, _ops.Wait)
    assert wait.box is None


def test_a_waiter_with_replicas_waits_on_its_bell() -> None:
    s = _flows.LockSpec.create("orders:42", 30.0, clock=FakeClock(), replicas=1)
    op: Any = next(_flows.Acquisition(s, 10.0, wait=True).run())
    assert isinstance(op, _ops.Call)  # no Listen: the grant must reach the replicas


def test_an_abandon_in_haste_is_short_and_tried_once() -> None:
    """The clean-up of an acquire the process interrupts on its way out (Ctrl-C, exit):
    bounded by PAST_DEADLINE, not the lock's reply bound, and with no retry after the
    client's back-off; an ordinary one keeps both."""
    clock = FakeClock()
    for hurried, bound, patient in [(False, 30.0, True), (True, _flows.PAST_DEADLINE, False)]:
        attempt = _flows.Acquisition(spec(clock, ttl=30.0), None, wait=True)
        first_op(attempt.run())
        op = next(attempt.abandon(hurried=hurried))
        assert isinstance(op, _ops.Call)
        assert op.script is spec(clock).kind.leave
        assert (op.timeout, op.patient) == (bound, patient)


@pytest.mark.parametrize("timeout", [0.0, 0.3, 3.0])
def test_a_wait_against_a_hung_server_ends_within_its_deadline_and_two_late_ops(
    timeout: float,
) -> None:
    """``acquire(timeout=T)`` against a server that never answers: the look at its
    settings comes out of T (it used to come on top), the try's reply is waited for
    until the deadline (at least PAST_DEADLINE, for a last try), and the clean-up after
    it gets PAST_DEADLINE: T and two late ops at most, whatever the lock's reply bound."""
    clock = FakeClock()
    attempt = _flows.Acquisition(spec(clock, ttl=30.0), timeout, wait=True)
    started = clock()
    assert attempt.settings_within() == pytest.approx(timeout)
    clock.advance(min(timeout, SETTINGS_WAIT))  # the look, given up on
    flow = attempt.run()
    op = first_op(flow)
    assert isinstance(op, _ops.Call)
    clock.advance(op.timeout)  # no reply: the driver gives up on it
    with pytest.raises(redlease.BackendError):
        flow.throw(redlease.BackendError("the server did not answer in time"))
    clean_up = next(attempt.abandon())
    assert isinstance(clean_up, _ops.Call)
    assert clean_up.timeout == pytest.approx(_flows.PAST_DEADLINE)
    clock.advance(clean_up.timeout)
    assert clock() - started <= timeout + 2 * _flows.PAST_DEADLINE


def test_a_try_and_a_wait_without_deadline_look_for_as_long_as_the_look_takes() -> None:
    clock = FakeClock()
    assert _flows.Acquisition(spec(clock), None, wait=False).settings_within() is None
    assert _flows.Acquisition(spec(clock), None, wait=True).settings_within() is None


@pytest.mark.parametrize("decoded", [False, True], ids=["bytes", "str"])
def test_an_acquire_reply_is_read_in_each_of_its_shapes(decoded: bool) -> None:
    """The acquire script answers in the shape cheapest for the server (see acquire.lua):
    an integer, a grant on the fast path; a string, a try that took nothing; a list, any
    other grant. Clients give a bulk string as bytes, or as text if they decode."""

    def bulk(text: str) -> str | bytes:
        return text if decoded else text.encode()

    read = _flows.acquire_reply
    assert read(1_764_000_000_123_456, 5000) == (1_764_000_000_123_456, 5000, 0, "")
    place = "t1|1764000030123456:5000:1764000000123456:ab12"
    assert read(bulk(f"4200:1764000000:000123:{place}"), 5000) == (
        0,
        4200,
        1_764_000_000_000_123,
        place,
    )
    assert read(bulk("-2:0:0:"), 5000) == (0, -2, 0, "")
    assert read([7, 4000, 1_764_000_000_000_123, 1, bulk("")], 5000) == (
        7,
        4000,
        1_764_000_000_000_123,
        "",
    )
    with pytest.raises(TypeError, match="acquire script's reply"):
        read([1, 2], 5000)
