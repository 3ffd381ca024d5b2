"""The sans-IO rules of the primitives around the plain lock's flows, driven by hand with
scripted replies and a fake clock: the fronts' `with` notes, reentrant holds, checks and
metrics hooks; the election, the multi-lock, the read/write lock's nesting, the reading of
INSPECT and the key layout."""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import AsyncIterator, Coroutine, Generator, Iterator
from typing import Any, TypeVar

import pytest

import redlease
from redlease._async import backend as _async_backend
from redlease._base import metrics as _metrics
from redlease._base.timing import (
    PASSING_RETRY_BASE,
    PASSING_RETRY_CAP,
    QUEUE_ENTRY_SLACK,
    SHORTEST_WAIT,
    UNKNOWN_HOLDER_RECHECK,
    drift,
)
from redlease._clients.errors import ReplyError
from redlease._rules import election as _election
from redlease._rules import flows as _flows
from redlease._rules import front as _front
from redlease._rules import inspect as _inspect
from redlease._rules import keys as _keys
from redlease._rules import lease as _lease
from redlease._rules import multilock as _multilock
from redlease._rules import ops as _ops
from redlease._rules import rwlock as _rwlock
from redlease._rules import scripts as _scripts
from redlease._sync import backend as _sync_backend
from redlease._wire.errors import backend_error
from redlease.testing import FakeClock

T = TypeVar("T")


def step(flow: Generator[Any, Any, Any], reply: Any) -> Any:
    """Send a reply; return the next op, or ('done', value) when the flow ends."""
    try:
        return flow.send(reply)
    except StopIteration as stop:
        return ("done", stop.value)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """A coroutine that never suspends, run to its end without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    raise AssertionError("the coroutine suspended")


def new_lease(clock: FakeClock, name: str = "orders:42", ttl: float = 10.0) -> _lease.LeaseState:
    """A lease as a grant made now gives it: valid for its ttl, drift taken off."""
    spec = _flows.LockSpec.create(name, ttl, clock=clock)
    grant = _flows.Grant(_flows.new_token(), 1, clock() + ttl - drift(ttl))
    return _lease.LeaseState(spec, grant, on_lost=None)


class Holder:
    """A thread or task as the holder tables know it (weakly referenced)."""


class Front(_front.FrontCore):
    """A lock's rules (which here also stand for the lock in its blocks' notes): a
    Lock's, or a reentrant one's."""

    def __init__(
        self, name: str = "orders:42", *, reentrant: bool = False, kind: str = "lock"
    ) -> None:
        spec = _flows.LockSpec.create(name, 10.0)
        super().__init__(spec, reentrant=reentrant, refuses_nesting=not reentrant, kind=kind)


@pytest.fixture(autouse=True)
def _no_block_noted() -> Iterator[None]:
    """Each test starts with no `with` block noted (the notes live in a context variable,
    which would otherwise carry over from one test to the next)."""
    token = _lease._entered.set(())
    yield
    _lease._entered.reset(token)


def noted() -> tuple[_lease._Entry, ...]:
    return _lease._entered.get()


def note(front: object, lease: Any, holder: object) -> _lease._Entry:
    """A block of ``front`` opened otherwise than by a `with` statement, noted."""
    entry = _lease.entered(front, lease, _lease.Opening(holder, None, -1))
    _lease.push_entered(entry)
    return entry


# --- fronts: the notes of `with` blocks ---------------------------------------------------


def test_a_nested_block_of_a_lock_its_holder_holds_is_refused_at_once() -> None:
    clock, front, holder = FakeClock(), Front(), Holder()
    note(front, new_lease(clock), holder)
    with pytest.raises(redlease.LockError) as refused:
        _lease.refuse_nested(front, front.noun, front.name, holder)
    message = str(refused.value)
    assert "lock 'orders:42' is held already by an enclosing `with` block" in message
    assert "reentrant=True" in message
    # another holder, or another object of the same name, waits as any other caller
    _lease.refuse_nested(front, front.noun, front.name, Holder())
    other = Front()
    _lease.refuse_nested(other, other.noun, other.name, holder)


@pytest.mark.parametrize("outer", ["released", "lost", "ending"])
def test_a_nested_block_is_let_through_once_the_outer_lease_is_no_longer_held(
    outer: str,
) -> None:
    clock, front, holder = FakeClock(), Front(), Holder()
    lease = new_lease(clock)
    note(front, lease, holder)
    if outer == "released":
        lease.mark_released()
    elif outer == "lost":
        clock.advance(10.0)  # past its validity
    else:
        _lease.close_entered(front)  # the outer block's end has begun
    _lease.refuse_nested(front, front.noun, front.name, holder)


def test_a_blocks_end_closes_the_innermost_open_block_of_its_own_lock() -> None:
    clock, front, other, holder = FakeClock(), Front(), Front(), Holder()
    outer, theirs, inner = new_lease(clock), new_lease(clock), new_lease(clock)
    note(front, outer, holder)
    note(other, theirs, holder)
    note(front, inner, holder)
    ending = _lease.close_entered(front)
    assert _lease.entered_lease(ending) is inner
    assert len(noted()) == 3  # closed, but dropped only last (tidy_entered)
    with pytest.raises(redlease.LockError):
        _lease.refuse_nested(front, front.noun, front.name, holder)  # the outer block is still open
    _lease.tidy_entered()
    assert [_lease.entered_lease(e) for e in noted()] == [outer, theirs]
    assert _lease.entered_lease(_lease.close_entered(front)) is outer
    _lease.tidy_entered()
    with pytest.raises(RuntimeError, match="did not enter it"):
        _lease.close_entered(front)
    assert _lease.close_entered(front, missing_ok=True) is None  # an interrupted clean-up
    assert [_lease.entered_lease(e) for e in noted()] == [theirs]


def test_a_release_is_told_begun_only_if_it_began_after_the_blocks_end_did() -> None:
    clock, front = FakeClock(), Front()
    lease = new_lease(clock)
    lease.release_calls = 1  # a release called inside the block, before its end
    note(front, lease, Holder())
    ending = _lease.close_entered(front)
    assert ending is not None
    assert not _lease.release_begun(ending)
    lease.release_calls += 1  # what release() counts first
    assert _lease.release_begun(ending)


def test_an_inner_reentrant_block_whose_hold_was_released_inside_it_releases_nothing() -> None:
    clock, front, holder = FakeClock(), Front(reentrant=True), Holder()
    lease = new_lease(clock)
    outer = note(front, lease, holder)
    lease.hold_again()
    inner = note(front, lease, holder)
    assert _lease.entered_lease(inner) is lease  # its own hold: released as it ends
    lease.drop_hold()  # the inner block released its hold itself
    assert _lease.entered_lease(inner) is None  # a release now would take the outer's
    assert _lease.entered_lease(outer) is lease
    assert _lease.entered_lease(None) is None
    multi = _multilock.MultiLeaseState(["a"], {"a": lease})
    assert _lease.entered_lease(note(front, multi, holder)) is multi  # (a multi-lease)


def test_forgetting_a_block_that_never_began_drops_its_note_only() -> None:
    clock, front, holder = FakeClock(), Front(), Holder()
    kept = note(front, new_lease(clock), holder)
    dropped = note(front, new_lease(clock), holder)
    _lease.forget_entered(dropped)
    assert noted() == (kept,)
    never_noted = _lease.entered(front, new_lease(clock), _lease.Opening(holder, None, -1))
    _lease.forget_entered(never_noted)  # interrupted before it was noted: nothing to drop
    assert noted() == (kept,)


class Probe:
    """A block whose ``__enter__`` reads where it is opened, as the fronts do."""

    def __init__(self) -> None:
        self.at: _lease.Opening | None = None

    def __enter__(self) -> Probe:
        self.at = _lease.opening("holder", sys._getframe(1))
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> Probe:
        self.at = _lease.opening("holder", sys._getframe(1))
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


def test_only_a_with_statement_says_where_its_block_was_opened() -> None:
    with Probe() as probe:
        pass
    assert probe.at is not None
    assert probe.at.frame is sys._getframe()
    assert probe.at.lasti >= 0
    called = Probe()
    called.__enter__()
    assert called.at == _lease.Opening("holder", None, -1)
    with contextlib.ExitStack() as stack:
        stacked = stack.enter_context(Probe())
    assert stacked.at == _lease.Opening("holder", None, -1)

    async def asynchronous() -> tuple[Probe, Probe, Any]:
        async with Probe() as probe:
            pass
        awaited = Probe()
        await awaited.__aenter__()
        return probe, awaited, sys._getframe()

    in_block, awaited, frame = run(asynchronous())
    assert in_block.at is not None
    assert in_block.at.frame is frame
    assert awaited.at == _lease.Opening("holder", None, -1)


class Interrupted:
    """A `with` block of ``front`` opened as the fronts open one, whose end is interrupted
    before its first line (``__exit__`` does nothing): its note stays open."""

    def __init__(self, front: Front, holder: object, clock: FakeClock) -> None:
        self.front, self.holder, self.clock = front, holder, clock
        self.leases: list[_lease.LeaseState] = []
        self.found: list[list[_lease._Entry]] = []  # the stale notes each opening found

    def __enter__(self) -> Interrupted:
        at = _lease.opening(self.holder, sys._getframe(1))
        self.found.append(_lease.stale_entered(at))
        lease = new_lease(self.clock)
        self.leases.append(lease)
        _lease.push_entered(_lease.entered(self.front, lease, at))
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_block_whose_end_was_cut_short_is_stale_once_its_with_statement_runs_again() -> None:
    clock, front, holder = FakeClock(), Front(), Holder()
    block = Interrupted(front, holder, clock)
    for _turn in range(2):  # a loop's next turn opens the same statement in the same frame
        with block:
            pass
    first, second = block.found
    assert first == []
    assert [_lease.entered_lease(e) for e in second] == [block.leases[0]]
    with block:  # another `with` statement of the same frame: not the same block
        pass
    assert block.found[2] == []
    for stale in second:
        _lease.close_stale(stale)
    assert [_lease.entered_lease(e) for e in noted()] == block.leases[1:]


def test_another_holder_or_a_block_not_opened_by_a_with_statement_is_never_stale() -> None:
    clock, front = FakeClock(), Front()
    blocks = [Interrupted(front, Holder(), clock) for _ in range(2)]
    for block in blocks:  # one statement, two holders
        with block:
            pass
    assert blocks[1].found == [[]]
    block = blocks[0]
    block.__enter__()
    block.__enter__()  # called twice, and not by a `with` statement
    assert block.found[1:] == [[], []]


# --- fronts: reentrant holds and metrics -------------------------------------------------


def test_a_reentrant_holder_is_given_its_lease_again_one_hold_more() -> None:
    clock, front, holder = FakeClock(), Front(reentrant=True), Holder()
    lease = new_lease(clock)
    assert front.held_by(holder) is None
    front.hold(holder, lease)
    assert front.held_by(holder) is lease
    assert lease.hold_count() == 2
    assert front.held_by(Holder()) is None  # another thread (task) acquires anew
    plain = Front()
    plain.hold(holder, lease)  # not reentrant: no table to note it in
    assert plain.held_by(holder) is None
    assert lease.hold_count() == 2


def test_a_reentrant_holder_whose_lease_was_lost_is_told_and_then_forgotten() -> None:
    clock, front, holder = FakeClock(), Front(reentrant=True), Holder()
    lease = new_lease(clock)
    front.hold(holder, lease)
    clock.advance(10.0)
    with pytest.raises(redlease.LockLost, match="acquired before was lost: its validity ran out"):
        front.held_by(holder)
    assert lease.holds == 1  # no hold taken on a lost lease
    assert front.held_by(holder) is None  # its next acquire is a new one


class Recorded:
    """One primitive's attribute sets as the fronts use them: what they were told."""

    def __init__(self, of: Meter, kind: str, mode: str | None, name: str) -> None:
        self.of, self.kind, self.mode, self.name = of, kind, mode, name
        self.told: list[tuple[Any, ...]] = []

    def granted(self, started: float) -> float:
        self.told.append(("granted", started))
        return started + 0.25  # when the hold starts: the lease keeps it

    def not_granted(self, started: float, *, waited: bool) -> None:
        self.told.append(("not granted", started, waited))

    def ended(self, since: float, *, lost: bool) -> None:
        self.told.append(("ended", since, lost))


class Meter:
    """The instruments as the fronts find them (``_base.metrics.instruments()``)."""

    def __init__(self) -> None:
        self.made: list[Recorded] = []

    def labels(self, kind: str, mode: str | None, name: str) -> Recorded:
        made = Recorded(self, kind, mode, name)
        self.made.append(made)
        return made


def test_an_acquire_is_metered_from_its_start_and_its_lease_until_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    meter = Meter()
    monkeypatch.setattr(_metrics, "instruments", lambda: meter)
    clock, front = FakeClock(), Front()
    lease = new_lease(clock)
    front.opened(lease, 5.0)
    (labels,) = meter.made
    assert (labels.kind, labels.mode, labels.name) == ("lock", None, "orders:42")
    front.not_granted(6.0, wait=True)
    front.not_granted(7.0, wait=False)
    lease.mark_released()  # its hold ends: from when the grant was counted
    assert labels.told == [
        ("granted", 5.0),
        ("not granted", 6.0, True),
        ("not granted", 7.0, False),
        ("ended", 5.25, False),
    ]
    assert len(meter.made) == 1  # made once, reused by every acquire
    anew = Meter()  # metrics configured anew: the lock's sets are made again
    monkeypatch.setattr(_metrics, "instruments", lambda: anew)
    front.not_granted(8.0, wait=False)
    assert [made.told for made in anew.made] == [[("not granted", 8.0, False)]]


def test_a_multi_locks_names_are_metered_as_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    meter = Meter()
    monkeypatch.setattr(_metrics, "instruments", lambda: meter)
    front = Front("a", kind="multilock")
    front.opened(new_lease(FakeClock(), "a"), 1.0)
    assert [(made.kind, made.name) for made in meter.made] == [("multilock", "a")]


def test_without_metrics_nothing_is_metered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_metrics, "instruments", lambda: None)
    front, lease = Front(), new_lease(FakeClock())
    front.opened(lease, 1.0)
    front.not_granted(1.0, wait=True)
    assert lease.labels is None
    assert front._labels is None


# --- fronts: the decorators -------------------------------------------------------------


class Guard:
    """A lock as the decorators use it: a `with` (`async with`) block, its steps noted."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    def __enter__(self) -> Guard:
        self.steps.append("enter")
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.steps.append("exit" if kind is None else f"exit on {kind.__name__}")

    async def __aenter__(self) -> Guard:
        self.steps.append("enter")
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.steps.append("exit" if kind is None else f"exit on {kind.__name__}")


def plain_function() -> None: ...


async def coroutine_function() -> None: ...


def generator_function() -> Iterator[int]:
    yield 1


async def async_generator_function() -> AsyncIterator[int]:
    yield 1


@pytest.mark.parametrize(
    ("fn", "want_async", "refusal"),
    [
        (42, False, "Guard decorates a function, not int"),
        (generator_function, False, "cannot decorate the generator function generator_function"),
        (async_generator_function, True, "generator function async_generator_function: its"),
        (plain_function, True, "Guard decorates an `async def` function, not plain_function"),
        (coroutine_function, False, "coroutine function coroutine_function: .* asyncio twin"),
    ],
)
def test_only_a_function_whose_work_is_done_within_its_call_is_decorated(
    fn: Any, want_async: bool, refusal: str
) -> None:
    decorator: Any = _async_backend.guarded if want_async else _sync_backend.guarded
    with pytest.raises(redlease.InvalidArgument, match=refusal):
        decorator(Guard(), fn)  # at once, before any call


def test_a_decorated_call_runs_inside_a_block_of_the_lock_and_keeps_its_face() -> None:
    guard = Guard()

    def work(x: int, *, y: int) -> int:
        """Adds."""
        guard.steps.append("work")
        return x + y

    locked = _sync_backend.guarded(guard, work)
    assert locked(1, y=2) == 3
    assert guard.steps == ["enter", "work", "exit"]
    assert (locked.__name__, locked.__doc__) == ("work", "Adds.")
    assert locked.__wrapped__ is work  # type: ignore[attr-defined]

    async def awaited(x: int) -> int:
        guard.steps.append("awaited")
        return x * 2

    guard.steps.clear()
    assert run(_async_backend.guarded(guard, awaited)(4)) == 8
    assert guard.steps == ["enter", "awaited", "exit"]


def test_a_callable_that_hands_back_a_coroutine_is_refused_inside_the_block() -> None:
    class Handler:
        """A callable object whose call makes a coroutine (an async ``__call__``'s way)."""

        def __init__(self) -> None:
            self.made: list[Coroutine[Any, Any, None]] = []

        def __call__(self) -> Coroutine[Any, Any, None]:
            self.made.append(coroutine_function())
            return self.made[-1]

    guard, handler = Guard(), Handler()
    locked = _sync_backend.guarded(guard, handler)  # nothing tells beforehand
    with pytest.raises(redlease.InvalidArgument, match="it returned a coroutine"):
        _ = locked()
    assert inspect.getcoroutinestate(handler.made[0]) == "CORO_CLOSED"  # never left to run
    assert guard.steps == ["enter", "exit on InvalidArgument"]


# --- election ---------------------------------------------------------------------------


def election_spec(clock: FakeClock, identity: str = "nœud-1:42") -> _flows.LockSpec:
    return _flows.LockSpec.create(
        "leader", 10.0, clock=clock, kind=_flows.ELECTION, token_tail=identity.encode().hex()
    )


class Box:
    """A hub's box as the flows see it: ``ready`` once the hub listens on the channel."""

    def __init__(self, token: str, ready: bool) -> None:
        self.token, self.hub, self.ready, self.pending = token, "ab12", ready, False

    def put(self, ring: bytes | None) -> None:
        raise AssertionError("the flows never ring a box")


def test_who_leads_is_read_from_the_lock_keys_token_and_the_term_from_its_fence() -> None:
    spec = election_spec(FakeClock())
    token = _flows.Acquisition(spec, 0.0, wait=False).token  # a candidate's
    assert _election.leader_of([token.encode(), b"7", 2500]) == (
        _election.Leader("nœud-1:42", 7),
        2500,
    )
    assert _election.leader_of([b"", 0, -2]) == (None, -2)  # nobody leads


@pytest.mark.parametrize("tail", ["zz", "abc", "ff", ""])  # not hex, odd, not UTF-8, none
def test_a_leader_token_no_candidate_wrote_reads_as_an_unknown_leader(tail: str) -> None:
    token = _flows.new_token() + tail
    assert _election.leader_of([token, 3, 900]) == (_election.Leader("?", 3), 900)


def test_reading_the_leader_registers_no_observer() -> None:
    spec = election_spec(FakeClock())
    flow = _election.read_leader(spec, _election.observers_of(spec))
    op: Any = next(flow)
    assert op.script is _scripts.ELECTION_WATCH
    assert op.keys == (
        "redlease:{leader}:elect",
        "redlease:{leader}:elect:fence",
        "redlease:{leader}:elect:observers",
    )
    assert op.args == ("", "0", "")  # no token, 0 ms registered: a read
    token = _flows.new_token() + b"ab".hex()
    assert step(flow, [token, 4, 100]) == ("done", (_election.Leader("ab", 4), 100))


def test_announcing_rings_the_observers_on_the_elections_bells() -> None:
    spec = election_spec(FakeClock())
    observers = _election.observers_of(spec)
    flow = _election.announce_change(spec, observers)
    op: Any = next(flow)
    assert op.script is _scripts.ELECTION_ANNOUNCE
    assert (
        op.keys
        == _election.keys_of(spec, observers)
        == (
            "redlease:{leader}:elect",
            "redlease:{leader}:elect:fence",
            "redlease:{leader}:elect:observers",
        )
    )
    assert op.args == ("redlease:{leader}:elect:bell:",)
    assert step(flow, 3) == ("done", None)  # however many were rung


def test_an_observer_without_a_hub_registers_for_longer_than_it_waits() -> None:
    spec = election_spec(FakeClock())
    observers = spec.keys.lock + ":observers"
    flow = _election.look(spec, observers, "obs", None)
    listen: Any = next(flow)
    assert isinstance(listen, _ops.Listen)
    assert (listen.prefix, listen.token, listen.box) == (
        "redlease:{leader}:elect:bell:",
        "obs",
        None,
    )
    watch: Any = step(flow, None)  # no hub: rung on its own bell
    assert watch.script is _scripts.ELECTION_WATCH
    assert watch.keys == _election.keys_of(spec, observers)
    token, life, hub = watch.args
    assert (token, hub) == ("obs", "")
    leader = _flows.new_token() + b"b".hex()
    _done, (seen, wait, box) = step(flow, [leader, 5, 2500])
    assert (seen, box) == (_election.Leader("b", 5), None)
    assert wait == pytest.approx(2.5 + _flows.EXPIRY_NUDGE)  # the leader's time left
    # registered for a whole ttl and the queue's slack: past the longest wait
    assert int(life) == (10.0 + QUEUE_ENTRY_SLACK) * 1000


def test_an_observer_with_a_hub_has_it_listen_before_it_registers_naming_it() -> None:
    spec = election_spec(FakeClock())
    flow = _election.look(spec, "obs-hash", "obs", None)
    next(flow)
    box = Box("obs", ready=False)
    subscribe: Any = step(flow, box)
    assert isinstance(subscribe, _ops.Listen)
    assert subscribe.box is box
    box.ready = True
    watch: Any = step(flow, box)
    assert watch.args[2] == "ab12"
    _done, (_leader, _wait, kept) = step(flow, [b"", 0, -2])
    assert kept is box
    # its next look: the hub listens already, straight to the script
    assert next(_election.look(spec, "obs-hash", "obs", box)).args[2] == "ab12"  # type: ignore[union-attr]
    # a box of another token is not this observer's: listen anew
    assert isinstance(next(_election.look(spec, "obs-hash", "obs", Box("x", True))), _ops.Listen)


def test_a_hub_refused_leaves_the_observer_on_its_bell() -> None:
    spec = election_spec(FakeClock())
    flow = _election.look(spec, "obs-hash", "obs", None)
    next(flow)
    step(flow, Box("obs", ready=False))
    watch: Any = step(flow, None)  # the server refused the channel
    assert watch.args[2] == ""
    assert step(flow, [b"", 0, -2])[1][2] is None


@pytest.mark.parametrize(
    ("pttl", "wait"),
    [
        (-2, 10.0),  # nobody leads: a leader elected and gone without a word is seen then
        (-1, 10.0),  # a lock key without TTL: a ttl at most
        (60_000, 10.0),  # more time left than a ttl: a ttl at most
        (0, SHORTEST_WAIT),  # never 0, which a blocking pop takes as "forever"
    ],
)
def test_an_observer_waits_a_ttl_at_most_and_never_zero(pttl: int, wait: float) -> None:
    flow = _election.look(election_spec(FakeClock()), "obs-hash", "obs", Box("obs", True))
    next(flow)
    token = _flows.new_token() + b"c".hex() if pttl != -2 else ""
    assert step(flow, [token, 1, pttl])[1][1] == pytest.approx(wait)


def test_an_observer_waits_for_its_ring_on_its_bell_or_through_its_hub() -> None:
    spec = election_spec(FakeClock())
    box = Box("obs", ready=True)
    flow = _election.rung(spec, "obs", box, 2.5)
    wait: Any = next(flow)
    assert wait == _ops.Wait("redlease:{leader}:elect:bell:obs", 2.5, spec.reply_timeout, None, box)
    assert step(flow, b"5:1000:1") == ("done", None)  # rung: it looks again


def test_an_observer_waits_out_a_failure_that_may_pass_and_raises_any_other() -> None:
    flow = _election.look(election_spec(FakeClock()), "obs-hash", "obs", Box("obs", True))
    next(flow)
    gone = backend_error(ConnectionRefusedError("refused"), "observe 'leader'")
    with pytest.raises(redlease.BackendError) as raised:
        flow.throw(gone)  # the look does not swallow it: the observer weighs it
    assert raised.value is gone
    for failures in range(1, 9):
        ceiling = min(PASSING_RETRY_CAP, PASSING_RETRY_BASE * 2**failures)
        assert ceiling / 2 <= _election.retry_after(gone, failures) <= ceiling
    refused = backend_error(ReplyError("READONLY You can't write against a replica"), "observe")
    with pytest.raises(redlease.BackendError, match="read-only replica") as raised:
        _election.retry_after(refused, 1)
    assert raised.value is refused


# --- multi-lock -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "refusal"),
    [
        ("ab", "names must be a list of lock names, not str"),
        (b"ab", "names must be a list of lock names, not bytes"),
        ({"a", "b"}, "names must be a list of lock names, not set"),
        ([], "names must not be empty"),
        (["a", ""], "name must not be empty"),
        (["a", 7], "name must be a str, not int"),
        (["b", "a", "b", "a", "c"], r"names must be distinct: \['a', 'b'\] given more than once"),
        ([str(i) for i in range(1001)], "names must be at most 1000, got 1001"),
    ],
)
def test_names_are_a_list_of_distinct_lock_names(names: Any, refusal: str) -> None:
    with pytest.raises(redlease.InvalidArgument, match=refusal):
        _multilock.checked_names(names)


def test_names_keep_the_order_they_were_given_in() -> None:
    assert _multilock.checked_names(("b", "a")) == ["b", "a"]
    assert len(_multilock.checked_names([str(i) for i in range(1000)])) == 1000


def multi_specs(clock: FakeClock, *names: str) -> list[_flows.LockSpec]:
    return [_flows.LockSpec.create(n, 10.0, clock=clock) for n in names]


def test_one_script_tries_every_name_with_one_token_and_reads_a_fence_each() -> None:
    specs = multi_specs(FakeClock(), "a", "b")
    flow = _multilock.try_all(specs, "tok")
    op: Any = next(flow)
    assert op.script is _scripts.MULTI_ACQUIRE
    assert op.keys == (
        "redlease:{a}",
        "redlease:{a}:fence",
        "redlease:{a}:line",
        "redlease:{b}",
        "redlease:{b}:fence",
        "redlease:{b}:line",
    )
    assert op.args == ("tok", "10000")
    assert op.timeout == specs[0].reply_timeout
    assert step(flow, [b"7", 3]) == ("done", [7, 3])


def test_a_try_one_name_stands_in_the_way_of_takes_none() -> None:
    flow = _multilock.try_all(multi_specs(FakeClock(), "a", "b"), "tok")
    next(flow)
    assert step(flow, []) == ("done", None)


@pytest.mark.parametrize(("fence", "error"), [(None, TypeError), (b"seven", ValueError)])
def test_a_fence_that_is_not_a_number_is_an_error_not_a_lease(
    fence: Any, error: type[Exception]
) -> None:
    flow = _multilock.try_all(multi_specs(FakeClock(), "a", "b"), "tok")
    next(flow)
    with pytest.raises(error):
        flow.send([b"7", fence])


def held(state: _lease.LeaseState) -> redlease.Lease:
    """The lease a caller holds over ``state`` (a multi-lease holds those)."""
    return redlease.Lease(state, io=None)  # type: ignore[arg-type]  # (no I/O here)


def test_a_multi_lease_is_valid_only_while_each_of_its_leases_is() -> None:
    clock = FakeClock()
    a, b = held(new_lease(clock, "a", ttl=10.0)), held(new_lease(clock, "b", ttl=5.0))
    multi = _multilock.MultiLeaseState(["b", "a"], {"a": a, "b": b})
    assert list(multi.leases) == ["b", "a"]  # the order the names were given in
    assert list(multi) == [b, a]
    assert multi.fences == {"b": b.fence, "a": a.fence}
    assert multi.remaining() == pytest.approx(5.0 - drift(5.0))  # the least of the two
    assert "['b', 'a']" in repr(multi)
    multi.check()
    clock.advance(5.0)
    assert multi.lost
    assert multi.remaining() == 0.0
    with pytest.raises(redlease.LockLost, match="'b' was lost"):
        multi.check()


def test_a_multi_lease_is_released_once_every_lease_is() -> None:
    clock = FakeClock()
    a, b = new_lease(clock, "a"), new_lease(clock, "b")
    multi = _multilock.MultiLeaseState(["a", "b"], {"a": held(a), "b": held(b)})
    a.mark_released()
    assert not multi.released
    assert not multi.lost
    b.mark_released()
    assert multi.released
    with pytest.raises(redlease.LockLost, match="'a' was released"):
        multi.check()


# --- read/write lock --------------------------------------------------------------------


Side = _rwlock.SideCore


def sides(clock: FakeClock) -> tuple[Side, Side]:
    specs = {
        mode: _flows.LockSpec.create(
            "doc",
            10.0,
            clock=clock,
            kind=_flows.READ_WRITE,
            extra=(str(_rwlock.READERS), mode),
        )
        for mode in (_rwlock.READ, _rwlock.WRITE)
    }
    tables = {mode: _lease.Holders() for mode in (_rwlock.READ, _rwlock.WRITE)}
    read, write = (Side(specs[mode], mode=mode, tables=tables) for mode in specs)
    return read, write


def rw_lease(side: Side, holder: object) -> _lease.LeaseState:
    """A lease of ``side`` its holder holds, noted in the side's table."""
    spec = side.spec
    grant = _flows.Grant(_flows.new_token(), 1, spec.clock() + spec.ttl - drift(spec.ttl))
    lease = _lease.LeaseState(spec, grant, on_lost=None)
    side.hold(holder, lease)
    return lease


def first_call(flow: Generator[Any, Any, Any]) -> Any:
    """The flow's first script call (a waiter's Listen answered as without a hub)."""
    op = next(flow)
    return flow.send(None) if isinstance(op, _ops.Listen) else op


def test_each_side_is_its_own_lock_with_its_own_holders() -> None:
    read, write = sides(FakeClock())
    assert read.noun == "read side of read/write lock"
    assert (write.kind, write.mode) == ("rwlock", "write")
    holder = Holder()
    lease = rw_lease(write, holder)
    assert write.held_by(holder) is lease  # the same mode again: one hold more
    assert lease.hold_count() == 2
    assert read.held_by(holder) is None  # the other mode is not re-entered


def test_a_first_lease_is_an_ordinary_attempt_of_its_mode() -> None:
    read, _write = sides(FakeClock())
    attempt = read.new_attempt(5.0, wait=True, holder=lambda: Holder())
    assert attempt.spec is read.spec
    assert (attempt.wait, attempt.also) == (True, ())
    op = first_call(attempt.run())
    assert op.script is _scripts.SHARED_ACQUIRE
    assert op.keys[0] == "redlease:{doc}:rw"
    assert op.args[-2:] == (str(_rwlock.READERS), "r")


def test_a_read_inside_a_write_is_a_downgrade_next_to_it_that_may_wait() -> None:
    read, write = sides(FakeClock())
    holder = Holder()
    held = rw_lease(write, holder)
    attempt = read.new_attempt(5.0, wait=True, holder=lambda: holder)
    assert (attempt.wait, attempt.also) == (True, (held.token,))
    op = first_call(attempt.run())
    assert op.args[-3:] == (str(_rwlock.READERS), "r", held.token)


def test_a_write_inside_a_read_is_an_upgrade_tried_once_and_never_queued() -> None:
    read, write = sides(FakeClock())
    holder = Holder()
    held = rw_lease(read, holder)
    attempt = write.new_attempt(None, wait=True, holder=lambda: holder)
    assert (attempt.wait, attempt.also) == (False, (held.token,))
    flow = attempt.run()
    op: Any = next(flow)  # straight to the script: a try listens for nothing
    assert op.script is _scripts.SHARED_ACQUIRE
    assert op.args[3] == "0"  # no queue entry
    assert op.args[-2:] == ("w", held.token)
    assert step(flow, [0, 5000, 1_000_000, 0, ""]) == ("done", None)  # refused: no wait


def test_a_lost_lease_of_the_other_mode_counts_for_nothing() -> None:
    clock = FakeClock()
    read, write = sides(clock)
    holder = Holder()
    rw_lease(read, holder)
    clock.advance(10.0)
    attempt = write.new_attempt(None, wait=True, holder=lambda: holder)
    assert (attempt.wait, attempt.also) == (True, ())
    write.refused(lambda: holder, wait=True)  # no upgrade: an ordinary wait that ran out


def test_an_upgrade_refused_raises_for_acquire_and_is_none_for_a_try() -> None:
    read, write = sides(FakeClock())
    holder = Holder()
    rw_lease(read, holder)
    with pytest.raises(redlease.LockError) as refused:
        write.refused(lambda: holder, wait=True)
    message = str(refused.value)
    assert "read/write lock 'doc'" in message
    assert "cannot be upgraded" in message
    assert "release the read lease first" in message
    write.refused(lambda: holder, wait=False)  # try_acquire: None
    write.refused(lambda: Holder(), wait=True)  # another holder: an ordinary timeout
    read.refused(lambda: holder, wait=True)  # a read is never an upgrade


# --- inspect ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lock", "election"])
def test_a_single_holder_is_read_in_one_call_and_its_fence_is_the_counters(kind: str) -> None:
    keys, name, _kind = _inspect.checked("orders:42", kind, "redlease:")
    flow = _inspect.inspect(keys, name, kind, 5.0)
    op: Any = next(flow)
    assert op == _ops.Call(_scripts.INSPECT, keys.script_keys, ("single", keys.bell_prefix), 5.0)
    done, info = step(flow, [1_000_000, b"42", [b"tok", 2500, b"", b"w"], []])
    assert done == "done"
    assert info == _inspect.LockInfo(
        name="orders:42",
        kind=kind,
        # one holder at a time, and only a grant moves the counter: its last value is the holder's
        holders=(_inspect.Holder("tok", 2.5, _inspect.EXCLUSIVE, 42),),
        fence=42,
        waiters=(),
    )
    assert info.held


@pytest.mark.parametrize("kind", ["semaphore", "rwlock"])
def test_shared_holds_are_read_with_their_fences_key(kind: str) -> None:
    keys, _name, _kind = _inspect.checked("doc", kind, "redlease:")
    op: Any = next(_inspect.inspect(keys, "doc", kind, 5.0))
    assert op.args[0] == "shared"
    assert len(op.keys) == 4
    assert op.keys[-1].endswith(":fences")


def test_a_holds_fence_is_its_own_where_many_may_hold() -> None:
    info = _inspect.decode(
        "doc",
        "rwlock",
        [1, "9", ["w1", "700", "9", "w", "r1", "300", "", "r"], []],
    )
    writer, reader = info.holders
    assert (writer.mode, writer.fence, writer.remaining) == (_inspect.EXCLUSIVE, 9, 0.7)
    # no fence of its own: unknown, not the counter's (the last of many holds')
    assert (reader.mode, reader.fence) == (_inspect.SHARED, None)
    assert info.fence == 9


@pytest.mark.parametrize("kind", ["lock", "election"])
def test_a_single_holder_without_a_fence_counter_has_no_fence(kind: str) -> None:
    info = _inspect.decode("x", kind, [1, b"", [b"tok", -1, b"", b"w"], []])
    (holder,) = info.holders
    assert holder.fence is None
    assert holder.remaining is None  # a key without a TTL
    assert info.fence is None


def test_waiters_are_read_in_queue_order_live_or_dead() -> None:
    info = _inspect.decode(
        "x",
        "lock",
        [
            1,
            b"",
            [],
            [b"w1", 1, 1_500_000, b"w2", 0, -200_000, b"w3", b"1", b"250000", "w4", "0", "9"],
        ],
    )
    assert info.waiters == (
        _inspect.Waiter("w1", True, 1.5),
        _inspect.Waiter("w2", False, -0.2),
        _inspect.Waiter("w3", True, 0.25),  # (a client that gives integers as text)
        _inspect.Waiter("w4", False, 0.000009),
    )
    assert info.live_waiters == 2
    assert not info.held


def test_a_truncated_reply_is_an_error_not_a_snapshot_missing_someone() -> None:
    with pytest.raises(ValueError, match="not enough values"):
        _inspect.decode("x", "lock", [1, b"3", [b"tok", 2500, b""], []])
    with pytest.raises(ValueError, match="not enough values"):
        _inspect.decode("x", "lock", [1, b"3", [], [b"w1", 1]])
    with pytest.raises(ValueError, match="not enough values"):
        _inspect.decode("x", "lock", [1, b"3", []])


def test_each_kind_word_names_its_primitive_and_its_keys() -> None:
    for word, kind in _inspect.KINDS.items():
        assert _inspect.kind_of(kind) == word
        keys, name, checked = _inspect.checked("n", word, "app:")
        assert (keys, name, checked) == (kind.layout("n", "app:"), "n", word)
    assert _inspect.checked("n", "rwlock", "app:")[0].lock == "app:{n}:rw"


def test_the_key_that_holds_a_names_holders_says_its_kind() -> None:
    for word, kind in _inspect.KINDS.items():
        keys = kind.layout("a{b}", "app:")
        assert _inspect.held_at(keys.lock, "app:") == (word, "a{b}")
        assert _inspect.held_at(keys.fence, "app:") is None  # (not where holders are)
        assert _inspect.held_at(keys.queue, "app:") is None
    assert _inspect.held_at("app:{n}:sem", "other:") is None
    assert _inspect.held_at("app:{n}:nothing", "app:") is None
    assert _inspect.held_at("cache:orders", "app:") is None


def test_the_commands_kinds_are_the_libraries() -> None:
    from redlease._cli.command import KINDS

    assert tuple(_inspect.KINDS) == KINDS


@pytest.mark.parametrize(
    ("name", "kind", "prefix", "refusal"),
    [
        ("n", "mutex", "redlease:", "kind must be one of 'lock', 'semaphore', 'rwlock', 'elect"),
        ("n", None, "redlease:", "kind must be one of"),
        ("", "lock", "redlease:", "name must not be empty"),
        ("n", "lock", "a{b", "prefix must not contain"),
    ],
)
def test_what_to_inspect_is_checked_naming_the_argument(
    name: Any, kind: Any, prefix: Any, refusal: str
) -> None:
    with pytest.raises(redlease.InvalidArgument, match=refusal):
        _inspect.checked(name, kind, prefix)


@pytest.mark.parametrize("kind", ["lock", "semaphore", "rwlock", "election"])
def test_a_forced_release_runs_the_kinds_release_leaving_no_mark(kind: str) -> None:
    """As the holder's own release, but marked for a millisecond: the holder's later
    release must learn its lease was taken, not take the mark for its own retried one."""
    flow = _inspect.forced_release("n", kind, "redlease:", "holder-token")
    op: Any = next(flow)
    release = _flows.LOCK.release if kind in ("lock", "election") else _flows.SEMAPHORE.release
    assert op.script is release
    assert op.keys == _inspect.KINDS[kind].layout("n", "redlease:").script_keys
    assert op.args[0] == "holder-token"
    assert op.args[3] == "1"  # the release mark's ms
    if kind != "election":
        assert step(flow, 1) == ("done", None)
        return
    announce = step(flow, 1)
    assert announce.script is _scripts.ELECTION_ANNOUNCE
    # the observers not told is a warning, not a failure of a release that was done
    gone = backend_error(ConnectionRefusedError("refused"), "announce 'n'")
    with pytest.raises(StopIteration):
        flow.throw(gone)


def test_a_forced_release_of_an_ended_hold_is_lock_lost() -> None:
    flow = _inspect.forced_release("n", "semaphore", "redlease:", "holder-token")
    next(flow)
    with pytest.raises(redlease.LockLost):
        flow.send(0)


# --- keys -------------------------------------------------------------------------------


def test_a_prefix_is_a_literal_in_a_glob_pattern() -> None:
    assert _keys.glob_escaped("a*b?[c]\\d") == "a\\*b\\?\\[c\\]\\\\d"
    assert _keys.every_lock("jobs[1]:") == "jobs\\[1\\]:{*"
    assert _keys.every_lock() == "redlease:{*"


def test_each_kind_keeps_its_keys_apart_and_all_in_the_names_slot() -> None:
    name = "a{b}%"
    tag = "{a%7Bb%7D%25}"
    layouts = {
        "": _keys.LockKeys.for_name(name),
        ":sem": _keys.LockKeys.for_semaphore(name),
        ":rw": _keys.LockKeys.for_read_write(name),
        ":elect": _keys.LockKeys.for_election(name),
    }
    slot = _keys.hash_slot(name.translate(_keys._ESCAPES))
    for suffix, keys in layouts.items():
        base = "redlease:" + tag + suffix
        shared = suffix in (":sem", ":rw")
        assert keys.script_keys == (
            base,
            base + ":fence",
            base + ":line",
            *([base + ":fences"] if shared else []),
        )
        assert keys.bell("t") == base + ":bell:t"
        assert {_keys.hash_slot(k) for k in (*keys.script_keys, keys.bell("t"))} == {slot}
    assert layouts[""].once == "redlease:" + tag + ":once"
    assert _keys.gate_key(name) == "redlease:" + tag + ":gate"
    assert _keys.hash_slot(_keys.gate_key(name)) == slot


def test_hash_slots_are_the_clusters() -> None:
    # CRC-16/XMODEM's check value (0x31C3), and slots any Cluster reports (CLUSTER KEYSLOT)
    assert _keys.hash_slot("123456789") == 0x31C3
    assert (_keys.hash_slot("foo"), _keys.hash_slot(b"hello")) == (12182, 866)
    assert _keys.hash_slot("{user1000}.following") == _keys.hash_slot("user1000")
    assert _keys.hash_slot("foo{bar}{zap}") == _keys.hash_slot("bar")  # the first tag
    assert _keys.hash_slot("foo{{bar}}zap") == _keys.hash_slot("{bar")  # to the next "}"
    # an empty tag is no tag: the whole key is hashed
    assert _keys.hash_slot("foo{}{bar}") == _keys._crc16(b"foo{}{bar}") % 16384


@pytest.mark.parametrize(
    ("key", "prefix", "read"),
    [
        ("redlease:{a%7Bb%7D%25}:fence", "redlease:", ("a{b}%", ":fence")),
        ("app:{x}", "app:", ("x", "")),
        ("redlease:{x}:queue", "app:", None),  # under another prefix
        ("redlease:x", "redlease:", None),  # no tag
        ("redlease:{}:fence", "redlease:", None),  # an empty tag: no name
        ("redlease:{x", "redlease:", None),  # a tag never closed
        ("redlease:{a{b}", "redlease:", None),  # a brace redlease would have escaped
        ("redlease:{a%7bb}", "redlease:", None),  # an escape redlease never writes
        ("redlease:{a%b}", "redlease:", None),  # a "%" it would have escaped
    ],
)
def test_a_key_reads_back_to_its_name_only_if_redlease_wrote_it(
    key: str, prefix: str, read: tuple[str, str] | None
) -> None:
    assert _keys.read_back(key, prefix) == read


def test_every_key_of_a_name_is_forgotten_within_two_leases_or_a_waiters_entry() -> None:
    lead_ms = -(-_keys.FENCE_LEAD_US // 1000)
    # a long lease: its fence counter outlives the last grant by two leases and a margin
    assert _keys.forgotten_within(10_000) == 2 * 10_000 + _keys.FENCE_MARGIN_MS + lead_ms
    # a short one: a waiter's queue entry, which looks again at least every second, lasts
    # longer than the counter
    entry_ms = (UNKNOWN_HOLDER_RECHECK + QUEUE_ENTRY_SLACK) * 1000
    assert _keys.forgotten_within(3) == entry_ms > 2 * 3 + _keys.FENCE_MARGIN_MS + lead_ms
