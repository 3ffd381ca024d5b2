"""The Redlock rules without I/O, driven by hand with scripted node results and a fake
clock: what each round sends, how each node's result is read, the validity and retry
arithmetic at its edges, and what a Redlock lease runs to extend and release."""

from __future__ import annotations

import random
from collections.abc import Generator
from typing import Any

import pytest

import redlease
from redlease._base.timing import drift
from redlease._clients.errors import ReplyError
from redlease._rules import flows as _flows
from redlease._rules import quorum as _quorum
from redlease._rules import redlock as _redlock
from redlease._rules import scripts as _scripts
from redlease._rules.ops import Sleep
from redlease._wire.errors import backend_error
from redlease.testing import FakeClock
from redlease.tools.chaos.unsafe import Unsafe

UNREAD = _quorum.UNREAD
LOCK_KEY = "redlease:{orders:42}"
FENCE_KEY = "redlease:{orders:42}:fence"
NO_ANSWER = "the server did not answer in time"
UNREACHABLE = "the server cannot be reached"


def qspec(
    n: int = 5,
    *,
    clock: FakeClock | None = None,
    ttl: float = 10.0,
    node_timeout: float | None = None,
    rules: _quorum.QuorumRules = _quorum.SAFE,
) -> _quorum.QuorumSpec:
    lock = _flows.LockSpec.create("orders:42", ttl, clock=clock or FakeClock())
    return _quorum.QuorumSpec.create(lock, [f"n{i}" for i in range(n)], node_timeout, rules)


def yes(counter: int) -> int:
    """An acquire's "ours here": the node's fence counter after this grant, alone."""
    return counter


def held(pttl_ms: int) -> list[int]:
    """An acquire's "held by another", with its holder's ms left."""
    return [0, 0, pttl_ms]


def silent(node: str) -> redlease.BackendError:
    """A node that did not answer in time, as the driver reports it."""
    return backend_error(TimeoutError("timed out"), "acquire 'orders:42'", server=node)


def unsent(node: str) -> redlease.BackendError:
    """A node whose command never left: no connection could be made."""
    refused = ConnectionRefusedError(111, "Connection refused")
    return backend_error(refused, "acquire 'orders:42'", _quorum.Unsent, server=node)


def fan(op: Any) -> _quorum.Fanout:
    assert isinstance(op, _quorum.Fanout), op
    return op


def step(flow: Generator[Any, Any, Any], results: Any) -> Any:
    """Send the results; return the next op, or ('done', value) when the flow ends."""
    try:
        return flow.send(results)
    except StopIteration as stop:
        return ("done", stop.value)


class Ends(random.Random):
    """A random source pinned to one end of every range: the schedule's bounds, exactly."""

    def __init__(self, *, high: bool) -> None:
        super().__init__(0)
        self.high = high

    def uniform(self, a: float, b: float) -> float:
        return b if self.high else a


# -- the spec -------------------------------------------------------------------------------


def test_a_majority_is_more_than_half_of_the_nodes() -> None:
    for n, majority in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)]:
        spec = qspec(n)
        assert spec.quorum == majority, n
        assert spec.everywhere == tuple(range(n))


@pytest.mark.parametrize(
    ("ttl", "given", "expected"),
    [
        (1.0, None, 0.05),  # a twentieth of the ttl
        (10.0, None, 0.1),  # capped: a busy client host stalls that long by itself
        (0.02, None, 0.002),  # floored: a twentieth would be 1 ms
        (10.0, 0.3, 0.3),  # as given
    ],
)
def test_a_nodes_reply_is_worth_a_twentieth_of_the_ttl_within_2_to_100_ms(
    ttl: float, given: float | None, expected: float
) -> None:
    spec = qspec(ttl=ttl, node_timeout=given)
    assert spec.node_timeout == pytest.approx(expected)
    first = fan(next(_quorum.QuorumAcquisition(spec, 0.0, wait=False).run()))
    assert first.timeout == first.call.timeout == pytest.approx(expected)


# -- an acquire round -----------------------------------------------------------------------


def test_a_round_sends_one_script_to_every_node_and_may_stop_reading_at_a_majority() -> None:
    attempt = _quorum.QuorumAcquisition(qspec(5), 0.0, wait=False)
    first = fan(next(attempt.run()))
    assert first.call.script is _scripts.REDLOCK_ACQUIRE
    assert first.call.keys == (LOCK_KEY, FENCE_KEY)
    # token, ttl ms, highest token handed out so far (none yet)
    assert first.call.args == (attempt.token, "10000", "0")
    assert first.nodes == (0, 1, 2, 3, 4)
    assert first.enough == 3
    assert first.yes is _quorum.took_it
    assert first.yes(yes(1))
    assert not first.yes(held(500))
    assert not first.yes(silent("n0"))


def test_an_agreeing_majority_is_granted_at_once_with_validity_counted_from_the_send() -> None:
    clock = FakeClock()
    spec = qspec(5, clock=clock)
    attempt = _quorum.QuorumAcquisition(spec, 0.0, wait=False)
    flow = attempt.run()
    next(flow)
    clock.advance(0.4)  # the round's time is the holder's loss
    # a "held" as it comes from clients that do and do not decode: bytes, text, ints
    done, grant = step(flow, [yes(7), yes(7), yes(7), [b"0", b"0", b"900"], ["0", "0", "900"]])
    assert done == "done"
    assert isinstance(grant, _quorum.QuorumGrant)
    assert (grant.token, grant.fence) == (attempt.token, 7)
    assert grant.valid_until == pytest.approx(1000.0 + 10.0 - drift(10.0))
    assert grant.nodes == frozenset({0, 1, 2})
    assert spec.high.fence == 7


def test_each_acquire_sends_the_highest_token_its_lock_has_handed_out() -> None:
    spec = qspec(3)
    for counter, sent_after in [(7, "7"), (4, "7"), (12, "12")]:  # a lower grant lowers nothing
        flow = _quorum.QuorumAcquisition(spec, 0.0, wait=False).run()
        next(flow)
        assert step(flow, [yes(counter), yes(counter), held(100)])[0] == "done"
        nxt = fan(next(_quorum.QuorumAcquisition(spec, 0.0, wait=False).run()))
        assert nxt.call.args[2] == sent_after


def test_validity_must_be_left_when_the_round_ends() -> None:
    ttl = 1.0
    longest = ttl - drift(ttl)  # validity of a round that took no time
    # a round that took all of it: no grant, and the lock is given back where it may be
    clock = FakeClock(0.0)
    spec = qspec(3, clock=clock, ttl=ttl)
    flow = _quorum.QuorumAcquisition(spec, 0.0, wait=False).run()
    next(flow)
    clock.advance(longest)
    release = fan(step(flow, [yes(3), yes(3), silent("n2")]))
    assert release.call.script is _scripts.REDLOCK_RELEASE
    assert release.nodes == (0, 1, 2)
    assert step(flow, [1, 1, silent("n2")]) == ("done", None)
    assert spec.high.fence == 0  # a token not handed out
    # a hair less: granted, valid for that hair
    clock = FakeClock(0.0)
    flow = _quorum.QuorumAcquisition(qspec(3, clock=clock, ttl=ttl), 0.0, wait=False).run()
    next(flow)
    clock.advance(longest - 0.001)
    _done, grant = step(flow, [yes(3), yes(3), silent("n2")])
    assert grant.valid_until == pytest.approx(longest)
    assert grant.valid_until - clock() == pytest.approx(0.001)


# -- fencing across nodes -------------------------------------------------------------------


def test_lagging_yes_nodes_are_raised_to_the_highest_counter_before_the_grant() -> None:
    attempt = _quorum.QuorumAcquisition(qspec(5), 0.0, wait=False)
    flow = attempt.run()
    next(flow)
    # node 0 restarted empty, node 3 missed grants; node 4 is held by another
    raise_round = fan(step(flow, [yes(4), yes(9), yes(9), yes(2), held(300)]))
    assert raise_round.call.script is _scripts.REDLOCK_FENCE
    assert raise_round.call.keys == (LOCK_KEY, FENCE_KEY)
    assert raise_round.call.args == (attempt.token, "9", "10000")
    assert raise_round.nodes == (0, 3)
    assert raise_round.enough == 0  # every lagging node, not just enough of them
    # node 3 could not be raised: nodes 0, 1 and 2 still make a majority at the token
    done, grant = step(flow, [1, silent("n3")])
    assert done == "done"
    assert grant.fence == 9
    assert grant.nodes == frozenset({0, 1, 2, 3})


def test_a_fence_round_that_leaves_too_few_nodes_at_the_token_gives_the_round_back() -> None:
    spec = qspec(3)
    attempt = _quorum.QuorumAcquisition(spec, 0.0, wait=False)
    flow = attempt.run()
    next(flow)
    raise_round = fan(step(flow, [yes(1), yes(9), silent("n2")]))
    assert raise_round.nodes == (0,)
    release = fan(step(flow, [0]))  # node 0 lost our key before it was raised
    assert release.call.script is _scripts.REDLOCK_RELEASE
    assert release.call.keys == (LOCK_KEY,)
    assert release.call.args == (raise_round.call.args[0],)  # the round's own token
    assert release.nodes == (0, 1, 2)  # the silent node may hold it too
    assert release.enough == 0  # every reply read: nothing left behind
    assert step(flow, [1, 1, 0]) == ("done", None)
    assert spec.high.fence == 0


def test_the_fence_round_is_sent_even_to_a_majority_that_agrees_and_its_time_counts() -> None:
    clock = FakeClock()
    flow = _quorum.QuorumAcquisition(qspec(3, clock=clock, ttl=1.0), 0.0, wait=False).run()
    next(flow)
    clock.advance(0.5)
    raise_round = fan(step(flow, [yes(9), yes(9), yes(1)]))  # 2 of 3 agree already
    assert raise_round.nodes == (2,)  # the more nodes hold the token, the more may fail
    clock.advance(0.5)  # the validity runs out during the fence round
    release = fan(step(flow, [1]))
    assert release.call.script is _scripts.REDLOCK_RELEASE
    assert release.nodes == (0, 1, 2)


# -- reading the nodes' results -------------------------------------------------------------


def test_a_tally_reads_each_result_as_yes_held_failed_or_unread() -> None:
    spec = qspec(7)
    round_ = spec.fan_out(_scripts.REDLOCK_ACQUIRE, spec.lock_and_fence, "t", yes=_quorum.took_it)
    readonly = backend_error(
        ReplyError("READONLY You can't write against a read only replica."),
        "acquire 'orders:42'",
        server="n5",
    )
    tally = _quorum.Tally(
        round_,
        [
            yes(7),
            ["0", "0", "1500"],
            silent("n2"),
            unsent("n3"),
            UNREAD,
            readonly,
            redlease.BackendError("no reply"),  # one that carries no reason of its own
        ],
    )
    assert tally.counters == {0: 7}
    assert tally.held == {1: 1500}
    assert tally.failures[2] == NO_ANSWER
    assert tally.failures[3] == UNREACHABLE
    assert "read-only replica" in tally.failures[5]
    assert tally.failures[6] == "BackendError: no reply"
    assert sorted(tally.failures) == [2, 3, 5, 6]  # unread is no failure
    assert tally.unsent == {3}
    assert tally.answered == 2
    # undone wherever the SET may have landed: not where another holds it, nor where
    # the command never left
    assert _quorum.SAFE.undo_round(tally, 7) == [0, 2, 4, 5, 6]


@pytest.mark.parametrize("junk", [None, [1, 7, 10_000], [1, None, 10_000], b"OK", -3], ids=repr)
def test_a_reply_of_another_shape_is_that_nodes_failure_never_a_yes_nor_a_no(junk: Any) -> None:
    # a majority of good yes-replies still takes the lock (every node is released later)
    attempt = _quorum.QuorumAcquisition(qspec(3), 0.0, wait=False)
    flow = attempt.run()
    next(flow)
    done, grant = step(flow, [yes(5), yes(5), junk])
    assert done == "done"
    assert grant.nodes == frozenset({0, 1})
    # too few understood: the round is given back, and the node is named as failed
    attempt = _quorum.QuorumAcquisition(qspec(3), 0.0, wait=False)
    flow = attempt.run()
    next(flow)
    release = fan(step(flow, [yes(5), junk, junk]))
    assert release.nodes == (0, 1, 2)  # a node whose reply was not read may hold it
    with pytest.raises(redlease.QuorumError, match="only 1 of 3 nodes answered") as e:
        flow.send([1, 1, 1])
    assert set(e.value.failures.values()) == {_quorum.NOT_UNDERSTOOD}
    # an extend's or a release's: it cannot tell, so the lease is not said lost
    extending = _quorum.extend(qspec(3), "tok", 10_000)
    next(extending)
    with pytest.raises(redlease.QuorumError, match="confirmed by 1 of 3 nodes"):
        extending.send([1, 0, junk])
    assert not _quorum.said_yes(junk)
    assert not _quorum.took_it(junk)
    # (an extend's or a release's "no" and "yes", 0 and 1, are no grant either as Python
    # gives them; a grant's counter is never 0)
    assert not _quorum.took_it(0)
    assert not _quorum.took_it(True)


def test_a_try_without_a_majority_tells_contention_from_an_outage() -> None:
    # as many answers as a majority, all "held": contention, None (one round even
    # without a deadline: a try never waits)
    flow = _quorum.QuorumAcquisition(qspec(5), None, wait=False).run()
    next(flow)
    busy = [held(100), held(100), held(100), silent("n3"), unsent("n4")]
    release = fan(step(flow, busy))
    assert release.nodes == (3,)  # neither the holders' nodes nor the one never sent to
    assert step(flow, [silent("n3")]) == ("done", None)
    # fewer answers than a majority: QuorumError naming each failed node, after releasing
    attempt = _quorum.QuorumAcquisition(qspec(5), 0.0, wait=False)
    flow = attempt.run()
    first = fan(next(flow))
    release = fan(step(flow, [yes(3), held(100), silent("n2"), silent("n3"), unsent("n4")]))
    assert release.nodes == (0, 2, 3)
    with pytest.raises(redlease.QuorumError, match="only 2 of 5 nodes answered, 3 needed") as e:
        flow.send([1, silent("n2"), silent("n3")])
    assert e.value.failures == {"n2": NO_ANSWER, "n3": NO_ANSWER, "n4": UNREACHABLE}
    assert f"n4: {UNREACHABLE}" in str(e.value)
    assert not attempt.outstanding  # released already: nothing for abandon() to do
    assert attempt.token != first.call.args[0]


# -- retries --------------------------------------------------------------------------------


def test_an_attempt_needs_abandoning_from_a_send_until_its_failed_round_is_released() -> None:
    clock = FakeClock()
    attempt = _quorum.QuorumAcquisition(qspec(3, clock=clock), 5.0, wait=True)
    flow = attempt.run()
    assert not attempt.outstanding
    first = fan(next(flow))
    assert attempt.outstanding
    assert first.call.args[0] == attempt.token
    fan(step(flow, [yes(2), silent("n1"), silent("n2")]))
    assert attempt.outstanding  # the release is under way
    pause = step(flow, [1, silent("n1"), silent("n2")])
    assert isinstance(pause, Sleep)
    assert not attempt.outstanding  # an interruption here leaves nothing behind
    clock.advance(pause.seconds)
    second = fan(step(flow, None))
    assert attempt.outstanding
    # a round of its own: a late release of the first cannot delete what this one holds
    assert second.call.args[0] == attempt.token != first.call.args[0]


@pytest.mark.parametrize("nodes", ["busy", "down"])
def test_a_wait_backs_off_between_rounds_and_ends_at_its_deadline(nodes: str) -> None:
    """Whether the nodes are held by another or out of reach, rounds are retried after
    a back-off that doubles from 2 ms up to 50 ms, the last sleep cut to the deadline;
    the last round says which it was: None (contention) or QuorumError (an outage)."""
    clock = FakeClock()
    attempt = _quorum.QuorumAcquisition(qspec(3, clock=clock), 0.2, wait=True, rng=Ends(high=True))
    flow = attempt.run()
    next(flow)
    results = [held(20_000)] * 3 if nodes == "busy" else [held(20_000), silent("n1"), silent("n2")]
    sleeps: list[float] = []
    while True:
        op = step(flow, results)
        if nodes == "down":
            assert fan(op).nodes == (1, 2)  # released where the SET may have landed
            try:
                op = step(flow, [silent("n1"), silent("n2")])
            except redlease.QuorumError as error:
                ended: object = error
                break
        if op == ("done", None):
            ended = None
            break
        assert isinstance(op, Sleep)
        sleeps.append(op.seconds)
        clock.advance(op.seconds)
        fan(step(flow, None))
    if nodes == "busy":
        assert ended is None
    else:
        assert isinstance(ended, redlease.QuorumError)
        assert "only 1 of 3 nodes answered, 2 needed" in str(ended)
        assert ended.failures == {"n1": NO_ANSWER, "n2": NO_ANSWER}
    assert sleeps == pytest.approx([0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05, 0.038])
    assert clock() == pytest.approx(1000.2)  # not a moment past the deadline, nor before


def test_the_retry_delay_ends_soon_after_a_majority_of_holders_expire() -> None:
    spec = qspec(3)
    round_ = spec.fan_out(_scripts.REDLOCK_ACQUIRE, spec.lock_and_fence, "t", yes=_quorum.took_it)
    high, low = Ends(high=True), Ends(high=False)

    def tally(*results: Any) -> _quorum.Tally:
        return _quorum.Tally(round_, list(results))

    far = tally(held(400), held(500), held(20_000))
    assert far.free_in(2) == pytest.approx(0.5)  # the second-soonest frees a majority
    assert _quorum.retry_delay(spec, 8, far, high) == pytest.approx(0.05)  # the cap first
    near = tally(held(3), held(5), held(20_000))
    assert _quorum.retry_delay(spec, 3, near, low) == pytest.approx(0.005)  # not 8 ms
    assert _quorum.retry_delay(spec, 3, near, high) == pytest.approx(0.007)  # a random hair
    # our own yes is released at once, a gone key (-2) is free: never below 1 ms
    free = tally(yes(4), held(-2), held(20_000))
    assert free.free_in(2) == 0.0
    assert _quorum.retry_delay(spec, 3, free, low) == _quorum.MIN_RETRY
    # unknown: a key without a ttl (-1), or too few answers; the back-off alone then
    for unknown in (tally(held(-1), held(3), held(3)), tally(held(3), silent("n1"), UNREAD)):
        assert unknown.free_in(2) is None
        assert _quorum.retry_delay(spec, 3, unknown, high) == pytest.approx(0.016)
    # a short lease caps the back-off at its ttl
    short = qspec(3, ttl=0.02)
    assert _quorum.retry_delay(short, 9, far, high) == pytest.approx(0.02)


def test_the_one_time_look_comes_out_of_a_waits_deadline_only() -> None:
    clock = FakeClock()
    spec = qspec(3, clock=clock)
    waiting = _quorum.QuorumAcquisition(spec, 2.0, wait=True)
    clock.advance(0.5)
    assert waiting.settings_within() == pytest.approx(1.5)
    assert _quorum.QuorumAcquisition(spec, 2.0, wait=False).settings_within() is None
    assert _quorum.QuorumAcquisition(spec, None, wait=True).settings_within() is None


# -- extend and release ---------------------------------------------------------------------


def test_extend_resets_the_ttl_everywhere_and_counts_from_before_the_send() -> None:
    clock = FakeClock()
    spec = qspec(5, clock=clock)
    flow = _quorum.extend(spec, "tok", 4000, wait=0.25)  # as the renewer sends it
    op = fan(next(flow))
    assert op.call.script is _scripts.EXTEND
    assert op.call.keys == (LOCK_KEY,)
    assert op.call.args == ("tok", "4000")
    assert op.nodes == (0, 1, 2, 3, 4)
    assert op.timeout == op.call.timeout == 0.25
    assert (op.enough, op.yes) == (3, _quorum.said_yes)
    clock.advance(0.3)
    done, until = step(flow, [1, b"1", "1", 0, UNREAD])
    assert done == "done"
    assert until == pytest.approx(1000.0 + 4.0 - drift(4.0))  # the new ttl's drift
    assert fan(next(_quorum.extend(spec, "tok", 4000))).timeout == spec.node_timeout


def test_an_extend_confirmed_after_its_new_validity_is_of_no_use() -> None:
    clock = FakeClock(0.0)
    flow = _quorum.extend(qspec(3, clock=clock), "tok", 4000)
    next(flow)
    clock.advance(4.0 - drift(4.0))
    with pytest.raises(redlease.QuorumError, match="confirmed too late to be of use") as e:
        flow.send([1, 1, 1])
    assert e.value.failures == {}


def test_release_goes_to_every_node_whatever_said_yes() -> None:
    spec = qspec(5)
    op = fan(next(_quorum.release(spec, "tok", frozenset({0, 1, 2}))))
    assert op.call.script is _scripts.REDLOCK_RELEASE
    assert op.call.keys == (LOCK_KEY,)
    assert op.call.args == ("tok",)
    assert op.nodes == (0, 1, 2, 3, 4)  # a node whose yes was lost may hold it too
    assert (op.enough, op.yes) == (3, _quorum.said_yes)


@pytest.mark.parametrize("action", ["extend", "release"])
@pytest.mark.parametrize(
    ("results", "outcome"),
    [
        ([1, 1, 1, 0, "fail"], "done"),
        ([1, 1, 1, UNREAD, UNREAD], "done"),  # the driver stopped reading at a majority
        ([1, 1, 0, 0, "fail"], "unknown"),  # the silent node may be ours: can't tell
        ([1, 0, 0, "fail", "fail"], "unknown"),
        ([1, 1, UNREAD, 0, "fail"], "unknown"),  # a reply not read confirms nothing
        ([1, 0, 0, 0, "fail"], "lost"),  # even if the silent node is ours: no majority
        ([0, 0, 0, 0, 0], "lost"),
    ],
    ids=[
        "majority",
        "majority-rest-unread",
        "silent-one-may-be-ours",
        "silent-two-may-be-ours",
        "unread-confirms-nothing",
        "lost-even-if-the-silent-one-is-ours",
        "ours-nowhere",
    ],
)
def test_extend_and_release_count_only_a_majority_and_say_lost_when_it_is_out_of_reach(
    action: str, results: list[Any], outcome: str
) -> None:
    spec = qspec(5)
    flow = (
        _quorum.extend(spec, "tok", 10_000)
        if action == "extend"
        else _quorum.release(spec, "tok", frozenset(spec.everywhere))
    )
    next(flow)
    sent = [silent(f"n{i}") if r == "fail" else r for i, r in enumerate(results)]
    failed = {f"n{i}": NO_ANSWER for i, r in enumerate(results) if r == "fail"}
    ours = results.count(1)
    if outcome == "done":
        assert step(flow, sent)[0] == "done"
    elif outcome == "lost":
        with pytest.raises(redlease.LockLost, match="expired or"):
            flow.send(sent)
    else:
        with pytest.raises(redlease.QuorumError, match=f"confirmed by {ours} of 5 nodes") as e:
            flow.send(sent)
        assert e.value.failures == failed


# -- the rules' seam ------------------------------------------------------------------------


def test_every_safety_decision_goes_through_the_specs_rules() -> None:
    """The fault harness's wrong variants reach each decision through ``spec.rules``:
    the size of a majority, when validity starts, what a failed round and a release undo."""
    clock = FakeClock()
    half = qspec(4, clock=clock, rules=Unsafe(half_quorum=True))
    assert half.quorum == 2
    assert fan(next(_quorum.QuorumAcquisition(half, 0.0, wait=False).run())).enough == 2
    late = _quorum.QuorumAcquisition(
        qspec(3, clock=clock, rules=Unsafe(ignore_elapsed=True)), 0.0, wait=False
    )
    flow = late.run()
    next(flow)
    clock.advance(0.4)
    _done, grant = step(flow, [yes(1), yes(1), held(5)])
    assert grant.valid_until == pytest.approx(clock() + 10.0 - drift(10.0))
    believed = qspec(3, rules=Unsafe(release_believed_only=True))
    flow = _quorum.QuorumAcquisition(believed, 0.0, wait=False).run()
    next(flow)
    fan(step(flow, [yes(1), yes(5), silent("n2")]))  # the fence round
    assert fan(step(flow, [0])).nodes == (0, 1)  # not the silent node
    assert fan(next(_quorum.release(believed, "tok", frozenset({2, 0})))).nodes == (0, 2)


# -- what a Redlock and its lease add (_rules.redlock) --------------------------------------


def test_a_quorum_lease_extends_and_releases_through_the_quorum_flows() -> None:
    clock = FakeClock()
    grant = _quorum.QuorumGrant("tok", 9, 1008.0, frozenset({1, 2}))
    for rules, released_on in [
        (_quorum.SAFE, (0, 1, 2)),
        (Unsafe(release_believed_only=True), (1, 2)),  # the nodes the grant names
    ]:
        spec = qspec(3, clock=clock, rules=rules)
        lease = _redlock.QuorumLeaseState(spec, grant, on_lost=None)
        assert (lease.token, lease.fence, lease.remaining()) == ("tok", 9, 8.0)
        extend = fan(next(lease.extend_flow(3000, 0.2)))
        assert extend.call.script is _scripts.EXTEND
        assert extend.call.args == ("tok", "3000")
        assert extend.timeout == 0.2
        assert extend.enough == spec.quorum
        release = fan(next(lease.release_flow(hurried=True)))
        assert release.call.script is _scripts.REDLOCK_RELEASE
        assert release.call.args == ("tok",)
        assert release.nodes == released_on


def test_a_redlocks_rules_are_its_quorum_specs_and_its_attempt_the_quorums() -> None:
    spec = qspec(5, ttl=2.5)
    core = _redlock.QuorumCore(spec.lock, quorum=spec)
    assert (core.name, core.spec.ttl, core.quorum.quorum) == ("orders:42", 2.5, 3)
    assert (core.kind, core.noun, core.refuses_nesting) == ("redlock", "lock", True)
    attempt = core.new_attempt(1.0, wait=False, holder=lambda: None)
    assert isinstance(attempt, _quorum.QuorumAcquisition)
    assert attempt.spec is spec
