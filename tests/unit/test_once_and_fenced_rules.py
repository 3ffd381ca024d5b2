"""The sans-IO rules of scheduled jobs (``_rules.once``) and of the fence gate for Redis
data (``_rules.fenced``), driven by hand with scripted replies and a fake clock: what each
flow sends, how each reply is read, and what is refused, with no server."""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from datetime import timedelta
from typing import Any

import pytest

import redlease
from redlease._base.timing import drift
from redlease._clients.errors import ReplyError
from redlease._rules import fenced as _fenced
from redlease._rules import flows as _flows
from redlease._rules import once as _once
from redlease._rules import ops as _ops
from redlease._rules import scripts as _scripts
from redlease._rules.keys import gate_key
from redlease._wire.errors import backend_error
from redlease.testing import FakeClock

NAME = "reports:nightly"
LOCK = "redlease:{reports:nightly}"
BELLS = LOCK + ":bell:"
STARTED_MS = 1_700_000_000_000  # the server's TIME (ms) at a run's start


def rule(
    at_most: object = 60.0,
    at_least: object = 0,
    every: object = None,
    ttl: object = None,
    fence_as: object = None,
) -> _once.OnceRule:
    return _once.OnceRule.create(at_most, at_least, every, ttl, fence_as)


def job_spec(clock: FakeClock, r: _once.OnceRule) -> _flows.LockSpec:
    """The job's lock, leased for the rule's lease length (as the drivers make it)."""
    return _flows.LockSpec.create(NAME, r.lease_ms / 1000.0, clock=clock)


def step(flow: Generator[Any, Any, Any], reply: Any) -> Any:
    """Send a reply; return the next op, or ('done', value) when the flow ends."""
    try:
        return flow.send(reply)
    except StopIteration as stop:
        return ("done", stop.value)


def sent(flow: Generator[Any, Any, Any]) -> _ops.Call:
    """The flow's next op: a script's call."""
    op = next(flow)
    assert isinstance(op, _ops.Call)
    return op


def started_run(clock: FakeClock, r: _once.OnceRule) -> tuple[_once.RunState, _flows.LockSpec]:
    s = job_spec(clock, r)
    run = _once.RunState(s, _once.OnceGrant("tok", 7, 0.0, STARTED_MS), None, r)
    return run, s


# -- the rule: at_most, at_least, every, ttl ------------------------------------------


def test_a_run_leases_for_at_most_unless_a_shorter_ttl_is_renewed_until_it() -> None:
    plain = rule(at_most=timedelta(minutes=1))
    assert (plain.at_most_ms, plain.at_least_ms, plain.period_ms) == (60_000, 0, 0)
    assert plain.lease_ms == 60_000
    assert not plain.renews
    renewed = rule(at_most=60, ttl=10, every=timedelta(hours=1))
    assert (renewed.lease_ms, renewed.period_ms) == (10_000, 3_600_000)
    assert renewed.renews
    assert not rule(at_most=60, ttl=60).renews  # a ttl of at_most is one lease: nothing to renew


def test_durations_are_whole_milliseconds_rounded_up() -> None:
    # rounded up, never down to 0: an at_least or a period of 0 would mean "none"
    r = rule(at_most=1.0001, at_least=0.0001, every=0.0005)
    assert (r.at_most_ms, r.at_least_ms, r.period_ms) == (1001, 1, 1)


def test_at_least_may_reach_at_most_and_zero_but_not_beyond() -> None:
    assert rule(at_most=60, at_least=60).at_least_ms == 60_000
    assert rule(at_least=timedelta(0)).at_least_ms == 0
    over = r"at_least \(60.001\) must not exceed at_most"
    with pytest.raises(redlease.InvalidArgument, match=over):
        rule(at_most=60, at_least=60.001)
    with pytest.raises(redlease.InvalidArgument, match="at_least must not be negative"):
        rule(at_least=-0.001)


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"ttl": 60.001}, r"ttl \(60.001\) must not exceed at_most \(60.0\)"),
        ({"at_most": 0.002}, "at_most must be at least 3 ms"),
        ({"at_most": "60"}, "at_most must be a number of seconds"),
        ({"at_least": True}, "at_least must be a number of seconds"),
        ({"every": 0}, "every must be positive"),
        ({"every": -1}, "every must be positive"),
        ({"ttl": 0.001}, "ttl must be at least 3 ms"),
        ({"fence_as": "not a name"}, "fence_as must be None or a keyword argument's name"),
        ({"fence_as": 3}, "fence_as must be None or a keyword argument's name"),
    ],
)
def test_a_rule_out_of_range_is_refused_naming_its_argument(
    given: dict[str, Any], match: str
) -> None:
    with pytest.raises(redlease.InvalidArgument, match=match):
        rule(**given)


# -- the one try ----------------------------------------------------------------------


def test_a_jobs_try_is_one_call_that_never_queues_and_sends_its_period() -> None:
    r = rule(at_most=60, ttl=10, every=3600)
    attempt = _once.OnceAttempt(job_spec(FakeClock(), r), r)
    assert not attempt.outstanding
    op = next(attempt.run())  # no Listen first: a try never waits on a bell
    assert isinstance(op, _ops.Call)
    assert attempt.outstanding  # sent: an interrupted try must be cleaned up
    assert op.script is _scripts.ONCE_ACQUIRE
    assert op.keys == (LOCK, LOCK + ":fence", LOCK + ":line", LOCK + ":once")
    assert op.args == (attempt.token, "10000", "1", "0", BELLS, "1", "", "", "20000", "3600000")
    assert op.patient is False
    assert op.timeout == pytest.approx(_flows.TRY_OPS)  # a try's bound, under the 10 s lease
    plain = rule()
    assert next(_once.OnceAttempt(job_spec(FakeClock(), plain), plain).run()).args[-1] == "0"


def test_a_grant_starts_the_run_at_the_servers_time_and_counts_the_flight_against_it() -> None:
    clock = FakeClock()
    r = rule(at_most=10)
    attempt = _once.OnceAttempt(job_spec(clock, r), r)
    flow = attempt.run()
    next(flow)
    clock.advance(0.3)
    done, grant = step(flow, [7, 10_000, STARTED_MS * 1000 + 999, 1, ""])
    assert done == "done"
    assert isinstance(grant, _once.OnceGrant)
    assert (grant.token, grant.fence) == (attempt.token, 7)
    assert grant.started_ms == STARTED_MS  # the server's µs, cut down to its ms
    assert grant.valid_until == pytest.approx(1000.0 + 10.0 - drift(10.0))
    assert attempt.skipped is None


@pytest.mark.parametrize(
    ("fence", "pttl", "reason", "retry_in"),
    [
        (0, 2500, _once.RUNNING, 2.5),  # held: the holder's time left
        (-1, 1_800_000, _once.RAN, 1800.0),  # the period's run made: until the next one
        (0, -1, _once.RUNNING, None),  # held with no time the server could tell
        (0, 0, _once.RUNNING, 0.0),  # held for no time more: known, not unknown
    ],
)
def test_a_refused_try_is_skipped_saying_why_and_when_it_may_run_again(
    fence: int, pttl: int, reason: str, retry_in: float | None
) -> None:
    r = rule(every=3600)
    attempt = _once.OnceAttempt(job_spec(FakeClock(), r), r)
    flow = attempt.run()
    next(flow)
    assert step(flow, [fence, pttl, STARTED_MS * 1000, 0, ""]) == ("done", None)  # one round trip
    skipped = attempt.skipped
    assert skipped is not None
    assert (skipped.name, skipped.reason, skipped.retry_in) == (NAME, reason, retry_in)


def test_a_grant_read_after_its_validity_is_given_back_with_its_period_and_skipped_late() -> None:
    r = rule(at_most=10)
    # valid for 10 s less the drift margin (0.102 s), counted from before the sending
    for elapsed, late in ((9.89, False), (9.9, True)):
        clock = FakeClock()
        s = job_spec(clock, r)
        attempt = _once.OnceAttempt(s, r)
        flow = attempt.run()
        next(flow)
        clock.advance(elapsed)
        op = step(flow, [7, 10_000, STARTED_MS * 1000, 1, ""])
        if not late:
            assert op[0] == "done"
            assert op[1].fence == 7
            continue
        assert isinstance(op, _ops.Call)
        assert op.script is _scripts.ONCE_LEAVE  # the period's record goes with the grant
        assert op.keys[-1] == LOCK + ":once"
        assert op.args == (attempt.token, "1", BELLS, "0", s.given_up_ms, "")
        assert (op.timeout, op.patient) == (_flows.PAST_DEADLINE, False)  # still a try's bound
        assert step(flow, [0, 0, 0]) == ("done", None)  # and no second try
        skipped = attempt.skipped
        assert skipped is not None
        assert (skipped.reason, skipped.retry_in) == (_once.LATE, None)


def test_a_failed_try_is_raised_at_once_even_a_failure_that_may_pass() -> None:
    r = rule()
    flow = _once.OnceAttempt(job_spec(FakeClock(), r), r).run()
    next(flow)
    failure = redlease.BackendError("the server did not answer in time")
    failure.transient = True  # a wait would sleep and try again; a try does not
    with pytest.raises(redlease.BackendError) as raised:
        flow.throw(failure)
    assert raised.value is failure


def test_a_try_that_meets_a_key_of_another_type_names_it() -> None:
    r = rule()
    flow = _once.OnceAttempt(job_spec(FakeClock(), r), r).run()
    next(flow)
    failure = redlease.BackendError("WRONGTYPE Operation against a key")
    failure.code = "WRONGTYPE"
    op = flow.throw(failure)
    assert isinstance(op, _ops.Command)
    assert op.args == ("TYPE", LOCK)
    assert step(flow, b"string").args == ("TYPE", LOCK + ":fence")  # each key asked in turn
    with pytest.raises(redlease.LockError, match=r"the key 'redlease:\{reports:nightly\}:fence'"):
        flow.send(b"hash")
    # the period's record too, once the lock's own keys are as they should be
    flow = _once.OnceAttempt(job_spec(FakeClock(), r), r).run()
    next(flow)
    asked: Any = flow.throw(failure)
    for answer in (b"string", b"string", b"list"):
        asked = step(flow, answer)
    assert asked.args == ("TYPE", LOCK + ":once")
    with pytest.raises(
        redlease.LockError, match=r"the key 'redlease:\{reports:nightly\}:once' holds a hash"
    ):
        flow.send(b"hash")


def test_giving_up_before_the_job_began_takes_back_the_grant_and_the_period() -> None:
    r = rule(at_least=5, every=3600)
    s = job_spec(FakeClock(), r)
    attempt = _once.OnceAttempt(s, r)
    flow = attempt.leave(keep=True)  # a run that never began is never kept
    op = sent(flow)
    assert op.script is _scripts.ONCE_LEAVE
    assert op.keys == (*s.keys.script_keys, LOCK + ":once")
    assert op.args == (attempt.token, "1", BELLS, "0", s.given_up_ms, "")
    assert op.patient is False
    assert step(flow, [9, 60_000, 1]) == ("done", None)  # a grant made meanwhile: given back
    # the run's own abandon (its job not begun): the same, on the lease's own bound
    run, rs = started_run(FakeClock(), r)
    op = sent(run.abandon_flow())
    assert (op.script, op.keys[-1]) == (_scripts.ONCE_LEAVE, LOCK + ":once")
    assert op.args == ("tok", "1", BELLS, "0", rs.given_up_ms, "")
    assert (op.timeout, op.patient) == (rs.reply_timeout, True)


# -- the run's extend and release -----------------------------------------------------


def test_a_runs_extend_ends_no_later_than_its_start_plus_at_most_by_the_servers_clock() -> None:
    clock = FakeClock()
    run, s = started_run(clock, rule(at_most=60, at_least=5, ttl=10))
    flow = run.extend_flow(10_000, wait=0.5)
    op = sent(flow)
    assert op.script is _scripts.ONCE_EXTEND
    assert op.keys == (LOCK,)
    assert op.args == ("tok", "10000", str(STARTED_MS + 60_000))
    assert op.timeout == 0.5
    clock.advance(0.2)
    # the server cut the lease to the 4 s at_most leaves: the validity is of those 4 s
    assert step(flow, 4000) == ("done", pytest.approx(1000.0 + 4.0 - drift(10.0)))
    assert sent(run.extend_flow(10_000)).timeout == s.reply_timeout
    over = run.extend_flow(10_000)
    next(over)
    with pytest.raises(redlease.LockLost, match="at_most time is over"):
        over.send(b"0")


def test_a_runs_release_keeps_the_name_until_its_start_plus_at_least() -> None:
    run, s = started_run(FakeClock(), rule(at_most=60, at_least=5))
    mark = str(math.ceil(s.reply_timeout * 1000))  # as long as the release may be retried
    flow = run.release_flow()
    op = sent(flow)
    assert op.script is _scripts.ONCE_RELEASE
    assert op.keys == s.keys.script_keys
    assert op.args == ("tok", "1", BELLS, mark, str(STARTED_MS + 5000))
    assert (op.timeout, op.patient) == (s.reply_timeout, True)
    assert step(flow, 1) == ("done", None)
    hurried = run.release_flow(hurried=True)
    op = sent(hurried)
    assert (op.script, op.args[-1]) == (_scripts.ONCE_RELEASE, str(STARTED_MS + 5000))
    assert (op.timeout, op.patient) == (_flows.PAST_DEADLINE, False)
    with pytest.raises(redlease.LockLost, match="already expired or been taken over"):
        hurried.send(0)
    # no at_least: kept until its start, which has passed: released at once
    plain, _ = started_run(FakeClock(), rule(at_most=60))
    assert sent(plain.release_flow()).args[-1] == str(STARTED_MS)


# -- a decorated job's call, and its skip ---------------------------------------------


# Jobs of each shape a fence keyword may meet.
def takes_fence_then_more(a: int, fence: int, b: int, c: int = 1) -> None: ...
def takes_fence_by_keyword(a: int, *, fence: int) -> None: ...
def takes_any_keyword(a: int, **more: Any) -> None: ...
def takes_no_fence(a: int) -> None: ...
def takes_fence_by_position(fence: int, /) -> None: ...
def takes_fence_before_rest(fence: int, *rest: int) -> None: ...


def test_the_parameters_after_the_fence_are_taken_by_keyword_only() -> None:
    call = _once.JobCall(takes_fence_then_more, "fence")
    assert call.shown is not None
    kinds = [(p.name, p.kind.name) for p in call.shown.parameters.values()]
    assert kinds == [("a", "POSITIONAL_OR_KEYWORD"), ("b", "KEYWORD_ONLY"), ("c", "KEYWORD_ONLY")]
    call.check((1,), {"b": 2}, "j")
    with pytest.raises(TypeError, match="job 'j' cannot be called so"):
        call.check((1, 2), {}, "j")  # 2 would reach the fence's place
    with pytest.raises(TypeError, match="job 'j' gets 'fence' from its run"):
        call.check((1,), {"b": 2, "fence": 3}, "j")
    by_keyword = _once.JobCall(takes_fence_by_keyword, "fence")
    assert by_keyword.shown is not None
    assert list(by_keyword.shown.parameters) == ["a"]


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (takes_no_fence, "takes no such keyword argument"),
        (takes_fence_by_position, "names a positional-only parameter"),
        (takes_fence_before_rest, r"names a parameter before \*rest"),
    ],
)
def test_a_fence_keyword_the_job_cannot_take_is_refused_when_decorating(
    fn: Callable[..., None], match: str
) -> None:
    with pytest.raises(redlease.InvalidArgument, match=match):
        _once.JobCall(fn, "fence")


def test_a_call_is_checked_against_the_jobs_own_signature_fence_and_all() -> None:
    through_keywords = _once.JobCall(takes_any_keyword, "fence")
    assert through_keywords.shown is None  # nothing to hide: **more takes the fence
    through_keywords.check((1,), {}, "j")
    with pytest.raises(TypeError, match="cannot be called so"):
        through_keywords.check((), {}, "j")
    no_fence = _once.JobCall(takes_no_fence, None)
    no_fence.check((1,), {}, "j")
    with pytest.raises(TypeError, match="cannot be called so"):
        no_fence.check((1, 2), {}, "j")
    unreadable = _once.JobCall(dict, "fence")  # no signature to check a call against
    assert unreadable.signature is None
    unreadable.check((1, 2, 3), {"x": 4}, "j")
    with pytest.raises(TypeError, match="do not pass it"):
        unreadable.check((), {"fence": 1}, "j")


def takes_nothing() -> None: ...
def takes_only_the_fence(fence: int) -> None: ...


def test_a_call_without_arguments_is_judged_once_and_alike_each_time() -> None:
    for needs_one in (_once.JobCall(takes_no_fence, None), _once.JobCall(takes_any_keyword, "f")):
        for _ in range(2):  # (the answer kept is the bind's: a call that cannot bind fails)
            with pytest.raises(TypeError, match="cannot be called so"):
                needs_one.check((), {}, "j")
    for bare in (_once.JobCall(takes_nothing, None), _once.JobCall(takes_only_the_fence, "fence")):
        for _ in range(2):
            bare.check((), {}, "j")
        assert bare.bare
        with pytest.raises(TypeError, match="cannot be called so"):
            bare.check((1,), {}, "j")  # (arguments are bound as before)


def test_a_skip_is_false_and_says_why_and_when_it_may_run() -> None:
    later = _once.Skipped(NAME, _once.RAN, 2.5)
    assert not later
    assert repr(later) == "<Skipped 'reports:nightly': ran this period, may run in 2.500s>"
    assert _once.skip_message(later) == (
        "scheduled job 'reports:nightly' skipped: ran this period; it may run in 2.500 s"
    )
    unknown = _once.Skipped(NAME, _once.RUNNING, None)
    assert "may run" not in repr(unknown)
    assert _once.skip_message(unknown) == "scheduled job 'reports:nightly' skipped: running"


# -- the fence gate: its arguments ----------------------------------------------------

RECORD = gate_key("orders:42")  # redlease:{orders:42}:gate
DATA = "shop:{orders:42}:"  # keys in the record's hash slot


def test_a_resource_is_a_non_empty_str_in_utf8() -> None:
    assert _fenced.resource("orders:42") == "orders:42"
    for wrong in ("", None, b"orders:42"):
        with pytest.raises(redlease.InvalidArgument, match="resource must be a non-empty str"):
            _fenced.resource(wrong)
    with pytest.raises(redlease.InvalidArgument, match="resource must be encodable as UTF-8"):
        _fenced.resource("orders:\ud800")


def test_a_fence_is_an_int_from_0_to_2_to_the_53_less_1() -> None:
    assert _fenced.fence(0) == 0
    assert _fenced.fence(2**53 - 1) == 2**53 - 1  # the greatest a Lua double holds exactly
    said = r"fence must be an int from 0 to 2\*\*53 - 1 \(a lease's fence\)"
    for wrong in (-1, 2**53, True, 1.0, "1", None):
        with pytest.raises(redlease.InvalidArgument, match=said):
            _fenced.fence(wrong)


def test_keep_is_positive_whole_milliseconds_rounded_up() -> None:
    assert _fenced.keep_ms(_fenced.DEFAULT_KEEP) == 86_400_000
    assert _fenced.keep_ms(timedelta(seconds=1.0005)) == 1001
    assert _fenced.keep_ms(0.0001) == 1
    for wrong in (0, -1):
        with pytest.raises(redlease.InvalidArgument, match="keep must be positive"):
            _fenced.keep_ms(wrong)
    with pytest.raises(redlease.InvalidArgument, match="keep must be a number of seconds"):
        _fenced.keep_ms("60")


# -- the fence gate: its commands -----------------------------------------------------


def test_commands_are_sent_as_keys_and_per_command_count_name_and_words() -> None:
    keys, words = _fenced.commands(
        (["set", DATA + "total", 5], ("HSET", b"shop:{orders:42}:h", "f", 1.5), ("DEL", 7)),
        RECORD,
        cluster=False,
    )
    assert keys == (RECORD, DATA + "total", b"shop:{orders:42}:h", "7")  # the record first
    # the name upper-cased (the script runs it so); numbers as their repr; bytes as given
    assert words == ("1", "SET", "5", "2", "HSET", "f", "1.5", "0", "DEL")


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ("SET k v", "commands must be a non-empty list of tuples"),
        (b"SET k v", "commands must be a non-empty list of tuples"),
        ([], "commands must be a non-empty list of tuples"),
        (None, "commands must be a non-empty list of tuples"),
        (["SET k v"], r"commands\[0\] must be a tuple \(name, key, ...\)"),
        ([("SET", "k", "v"), 3], r"commands\[1\] must be a tuple"),
        ([("SET",)], r"commands\[0\] must name a command and its key"),
        ([(b"SET", "k", "v")], r"commands\[0\] must name a command and its key"),
        ([("SET", "k", "v"), ("mset", "a", "1")], r"commands\[1\]: MSET is not taken by the gate"),
        ([("Eval", "return 1", "0")], "EVAL is not taken by the gate"),
        ([("DEL", "a", "b")], "DEL is not taken by the gate"),
        ([("exists", "a", "b")], "EXISTS is not taken by the gate"),
        ([("ping", "hello")], "PING is not taken by the gate"),  # (no key: an echo)
        ([("INFO", "server")], "INFO is not taken by the gate"),
        ([("SET", RECORD, "1")], r"commands\[0\] writes the gate's own record"),
        ([("SET", RECORD.encode(), "1")], "writes the gate's own record"),
        ([("SET", None, "1")], r"commands\[0\]'s key must be str, bytes, int or float"),
        ([("SET", False, "1")], r"commands\[0\]'s key must be str, bytes, int or float"),
        ([("SET", "k", None)], r"commands\[0\]'s arguments must be str, bytes, int or float"),
        ([("SET", "k", True)], r"commands\[0\]'s arguments must be str, bytes, int or float"),
        ([("SET", "k", "\ud800")], r"commands\[0\]'s arguments must be encodable as UTF-8"),
        ([("SET", "\ud800", "1")], r"commands\[0\]'s key must be encodable as UTF-8"),
    ],
)
def test_commands_the_gate_cannot_take_are_refused_naming_the_command(
    given: object, match: str
) -> None:
    with pytest.raises(redlease.InvalidArgument, match=match):
        _fenced.commands(given, RECORD, cluster=False)


def test_one_command_carries_at_most_max_words_after_its_key() -> None:
    most = ("RPUSH", "k", *["x"] * _fenced.MAX_WORDS)
    _keys, words = _fenced.commands([most], RECORD, cluster=False)
    assert words[0] == str(_fenced.MAX_WORDS)
    with pytest.raises(redlease.InvalidArgument, match="7001 arguments after its key, more than"):
        _fenced.commands([("SET", "k", "v"), (*most, "x")], RECORD, cluster=False)
    assert _fenced.commands([("DEL", "k")], RECORD, cluster=False)[1] == ("0", "DEL")  # one key


def test_on_a_cluster_every_key_must_be_in_the_records_hash_slot() -> None:
    inside = [("SET", DATA + "a", "1"), ("SET", b"shop:{orders:42}:b", "2")]
    assert _fenced.commands(inside, RECORD, cluster=True)[0] == (RECORD, DATA + "a", inside[1][1])
    outside = [("SET", DATA + "a", "1"), ("SET", "shop:b", "2")]
    with pytest.raises(redlease.InvalidArgument, match=r"commands\[1\]'s key 'shop:b' is not in"):
        _fenced.commands(outside, RECORD, cluster=True)
    assert _fenced.commands(outside, RECORD, cluster=False)[0][-1] == "shop:b"
    # the tag to give is the resource's, escaped as the record's key has it
    with pytest.raises(redlease.InvalidArgument, match=r"hash tag \(\{a%7Bb%7D\}\)"):
        _fenced.commands([("SET", "x", "1")], gate_key("a{b}"), cluster=True)


# -- the fence gate: its script and its reply -----------------------------------------

SENT = [("HSET", DATA + "h", "f", "v"), ("DEL", DATA + "old"), ("INCRBY", DATA + "n", 3)]


def applied(value: int = 9) -> Generator[Any, Any, list[Any]]:
    keys, words = _fenced.commands(SENT, RECORD, cluster=False)
    return _fenced.apply("orders:42", RECORD, value, 86_400_000, keys, words, 5.0)


def test_apply_sends_the_fence_and_keep_then_the_words_and_gives_the_replies_in_order() -> None:
    flow = applied()
    op = next(flow)
    assert isinstance(op, _ops.Call)
    assert op.script is _scripts.FENCED_APPLY
    assert op.keys == (RECORD, DATA + "h", DATA + "old", DATA + "n")
    assert op.args == ("9", "86400000", "2", "HSET", "f", "v", "0", "DEL", "1", "INCRBY", "3")
    assert op.timeout == 5.0
    assert step(flow, [b"1", 1, 0, 4]) == ("done", [1, 0, 4])


def test_a_stale_fence_is_refused_naming_the_greater_one_recorded() -> None:
    flow = applied(9)
    next(flow)
    said = "fence 9 for 'orders:42' is stale: fence 12 has passed"
    with pytest.raises(redlease.StaleFence, match=said) as e:
        flow.send([0, b"12"])
    assert (e.value.resource, e.value.fence, e.value.recorded) == ("orders:42", 9, 12)
    assert isinstance(e.value, redlease.LockLost)  # the lease that brought it is lost


@pytest.mark.parametrize(("failed", "name"), [(1, "HSET"), (2, "DEL"), (3, "INCRBY")])
def test_a_failed_command_is_named_with_how_many_before_it_stand(failed: int, name: str) -> None:
    flow = applied()
    next(flow)
    said = rf"commands\[{failed - 1}\] \({name}\) failed: WRONGTYPE Operation"
    with pytest.raises(redlease.BackendError, match=said) as e:
        flow.send([-1, failed, b"WRONGTYPE Operation against a key"])
    assert f"the {failed - 1} before it were applied" in str(e.value)


def test_the_recorded_fence_is_none_only_when_no_record_lives() -> None:
    flow = _fenced.recorded(RECORD, 5.0)
    op = sent(flow)
    assert (op.script, op.keys, op.args, op.timeout) == (_scripts.FENCED_READ, (RECORD,), (), 5.0)
    for reply, read in ((b"12", 12), (b"0", 0), (None, None), (False, None)):  # 0 is a fence
        flow = _fenced.recorded(RECORD, 5.0)
        next(flow)
        assert step(flow, reply) == ("done", read)


# --- the period record, as an operator reads it -----------------------------------------


def test_the_period_record_is_read_as_the_grant_wrote_it() -> None:
    flow = _once.last_period("job", "redlease:", 5.0)
    get: Any = next(flow)
    assert get.args == ("GET", "redlease:{job}:once")
    pttl: Any = step(flow, b"417:run-token")
    assert pttl.args == ("PTTL", "redlease:{job}:once")
    assert step(flow, 1500) == ("done", _once.Period(run="run-token", next_in=1.5))


@pytest.mark.parametrize(("record", "left"), [(None, -2), (b"1:t", -1), (b"1:t", -2)])
def test_no_record_or_one_without_a_ttl_is_no_period(record: Any, left: int) -> None:
    flow = _once.last_period("job", "redlease:", 5.0)
    next(flow)
    step(flow, record)
    assert step(flow, left) == ("done", None)


def test_a_key_of_another_type_is_no_period_and_other_failures_are_raised() -> None:
    wrong = backend_error(ReplyError("WRONGTYPE Operation against a key"), "inspect 'job'")
    flow = _once.last_period("job", "redlease:", 5.0)
    next(flow)
    with pytest.raises(StopIteration) as ended:
        flow.throw(wrong)
    assert ended.value.value is None
    refused = backend_error(ConnectionRefusedError("refused"), "inspect 'job'")
    flow = _once.last_period("job", "redlease:", 5.0)
    next(flow)
    with pytest.raises(redlease.BackendError):
        flow.throw(refused)
