"""Errors raised by signal handlers (a Ctrl-C that the application catches and goes on
after, as a graceful shutdown does) can land between any two steps. None may leave a
lock of the process's own taken for good: after thousands of them, at random moments of
lock blocks and scheduled-job runs, the process still runs to its end."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import redis

import redlease
from redlease._rules.flows import Acquisition
from redlease._sync.conn import SocketConnection
from redlease._sync.front import Front
from redlease.tools import servers

_SCRIPT = r"""
import faulthandler, random, signal, sys, time
import redis, redlease
faulthandler.dump_traceback_later(float(sys.argv[3]), exit=True)  # a hang: traceback, exit 1
r = redis.Redis(port=int(sys.argv[1]))
name = sys.argv[2]

fired = False

def interrupt(*_):
    global fired
    fired = True
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
rng = random.Random(7)
interrupted = 0
for i in range(int(sys.argv[4])):
    # A name of its own each time: an interrupt can be lost (one raised in a weakref
    # callback is ignored), and a block cut at its very edge can leave its lease held;
    # a later block must not wait on that. What is shared is the process's own state.
    lock = redlease.Lock(r, f"{name}:lock:{i}", ttl=30, auto_renew=True)
    job = redlease.once(r, f"{name}:job:{i}", at_most=30, ttl=1)
    body = job(lambda: None)
    fired = False
    try:  # the timer fires once, within this block: at the latest in the wait at its end
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-5, 8e-4))
        try:
            if i % 2:
                with lock:
                    pass
            else:
                body()
        except redlease.LockError:
            pass
        while not fired:  # (a sleep alone: a process scheduled late took it after the try)
            time.sleep(0.0005)
    except KeyboardInterrupt:
        interrupted += 1
print("done", interrupted, flush=True)
"""


@pytest.mark.timeout(200)
def test_interrupts_at_random_moments_never_leave_the_process_hung(
    server: servers.ServerProcess, name: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(server.port), name, "90", "3000"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said, interrupted = done.stdout.split()[:2]
    assert said == "done"
    assert int(interrupted) > 100  # the interrupts did land, many of them inside the calls


_HELD_SCRIPT = r"""
import faulthandler, random, signal, sys, time
import redis, redlease
faulthandler.dump_traceback_later(float(sys.argv[3]), exit=True)
r = redis.Redis(port=int(sys.argv[1]))
prefix, blocks = sys.argv[2], int(sys.argv[4])

fired = False

def interrupt(*_):
    global fired
    fired = True
    raise KeyboardInterrupt

def make(kind, name):
    options = dict(ttl=2, auto_renew=True)
    if kind == "lock":
        return redlease.Lock(r, name, **options), [(name, "lock")]
    if kind == "semaphore":
        return redlease.Semaphore(r, name, limit=2, **options), [(name, "semaphore")]
    if kind in ("read", "write"):
        return getattr(redlease.ReadWriteLock(r, name, **options), kind), [(name, "rwlock")]
    both = [(name, "lock"), (name + ":b", "lock")]
    return redlease.MultiLock(r, [name, name + ":b"], **options), both

signal.signal(signal.SIGALRM, interrupt)
rng = random.Random(3)
for kind in ("lock", "semaphore", "read", "write", "multilock"):
    names, interrupted = [], 0
    # One turn more, not interrupted: a block cut as its __exit__ starts (before any line
    # of redlease's) is given back when its `with` statement runs again, not before.
    for i in range(blocks + 1):
        lock, read = make(kind, f"{prefix}:{kind}:{i}")
        cut = i < blocks
        if cut:
            names.append(read)
        try:
            if cut:
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-6, 8e-4))
            try:
                with lock:
                    pass
            except redlease.LockError:
                pass
            if cut:
                time.sleep(0.001)  # (the timer fires at the latest here)
        except KeyboardInterrupt:
            interrupted += 1
    signal.setitimer(signal.ITIMER_REAL, 0)
    def held():
        return sum(any(redlease.read_info(r, n, kind=k).held for n, k in each) for each in names)
    now = held()
    time.sleep(2.5)  # a block left held and not renewed has expired by now
    print(kind, interrupted, now, held(), flush=True)
"""


@pytest.mark.timeout(300)
def test_interrupts_at_random_moments_leave_no_name_held_or_renewed(
    server: servers.ServerProcess, name: str
) -> None:
    """SIGALRM at a random moment of 1,500 blocks per primitive (1-800 us in: acquire,
    the block's start, its end, the release): at most one block in 1,000 leaves its name
    held, and none is renewed after its block (2 s leases, renewed)."""
    blocks = 1500
    done = subprocess.run(
        [sys.executable, "-c", _HELD_SCRIPT, str(server.port), name, "240", str(blocks)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for line in done.stdout.splitlines():
        _, interrupted, held, renewed = line.split()
        assert int(interrupted) > blocks // 2, line  # most landed inside the block's calls
        assert int(held) <= blocks // 1000, line
        assert int(renewed) == 0, line
    assert len(done.stdout.splitlines()) == 5, done.stdout


# -- An interrupt at each step of a block's start and end, landed deterministically ----
#
# A trace function that raises as a given function starts is what a signal handler's
# error at that moment does (CPython runs handlers as a function begins): the function's
# body never runs.


def _interrupt_at(qualname: str, nth: int = 1, at: str = "call") -> None:
    """Raise KeyboardInterrupt as the ``nth`` call of ``qualname`` in this thread starts
    (or, ``at="return"``, as it returns: its caller never gets what it returned)."""
    seen = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal seen
        if event == "call" and at == "return":
            return tracer if getattr(frame.f_code, "co_qualname", "") == qualname else None
        if event == at and getattr(frame.f_code, "co_qualname", "") == qualname:
            seen += 1
            if seen == nth:
                sys.settrace(None)
                raise KeyboardInterrupt
        return None

    sys.settrace(tracer)


def _primitive(r: redis.Redis, name: str, kind: str) -> tuple[Any, str]:
    """A block's lock of ``kind``, renewed (its renewal must end with the block), and
    the kind ``read_info`` reads."""
    if kind == "lock":
        return redlease.Lock(r, name, ttl=30.0, auto_renew=True), "lock"
    if kind == "reentrant":
        return redlease.Lock(r, name, ttl=30.0, auto_renew=True, reentrant=True), "lock"
    if kind == "semaphore":
        return redlease.Semaphore(r, name, limit=2, ttl=30.0, auto_renew=True), "semaphore"
    if kind == "write":
        return redlease.ReadWriteLock(r, name, ttl=30.0, auto_renew=True).write, "rwlock"
    if kind == "once":  # (a job's run: its lease renewed, 5 s at a time)
        return redlease.Once(r, name, at_most=30.0, ttl=5.0), "lock"
    return redlease.MultiLock(r, [name, name + ":b"], ttl=30.0, auto_renew=True), "lock"


def _left_held(r: redis.Redis, name: str, kind: str) -> list[str]:
    names = [name, name + ":b"] if kind == "lock" else [name]
    return [n for n in names if redlease.read_info(r, n, kind=kind).held]


# (window, the function whose start is interrupted, which call of it, the primitives)
_ENTERING = [
    ("grant-to-lease", "Front._watched", 1, ("lock", "semaphore", "write")),
    ("noted-for-the-block", "push_entered", 1, ("lock", "semaphore", "write", "multi")),
    ("multi-second-lease", "Front._watched", 2, ("multi",)),
    ("multi-leased", "MultiLock._leased", 1, ("multi",)),
]
_ENDING = [
    ("exit-finds-its-note", "close_entered", 1, ("lock", "semaphore", "write", "multi")),
    ("exit-knows-its-lease", "entered_lease", 1, ("lock", "semaphore", "write", "multi")),
    ("lease-exit", "Lease.__exit__", 1, ("lock", "semaphore", "write")),
    ("release-begins", "Lease.release", 1, ("lock", "semaphore", "write")),
    ("release-before-its-script", "LeaseState.release_flow", 1, ("lock", "semaphore")),
    ("release-sending", "SocketConnection.send", 1, ("lock", "semaphore", "write")),
    ("multi-release", "MultiLease.release", 1, ("multi",)),
    ("multi-after-first-name", "Lease.release", 2, ("multi",)),
]


def _cases(windows: list[tuple[str, str, int, tuple[str, ...]]]) -> list[Any]:
    return [
        pytest.param(function, nth, kind, id=f"{window}-{kind}")
        for window, function, nth, kinds in windows
        for kind in kinds
    ]


@pytest.mark.parametrize(("function", "nth", "kind"), _cases(_ENTERING))
def test_an_interrupt_as_a_block_opens_leaves_nothing_held(
    r: redis.Redis, name: str, function: str, nth: int, kind: str
) -> None:
    lock, read_as = _primitive(r, name, "lock" if kind == "multi" else kind)
    if kind == "multi":
        lock = redlease.MultiLock(r, [name, name + ":b"], ttl=30.0, auto_renew=True)
    _interrupt_at(function, nth)
    try:
        with pytest.raises(KeyboardInterrupt), lock:
            pytest.fail("the block ran")
    finally:
        sys.settrace(None)
    assert _left_held(r, name, read_as) == []
    with lock:  # and the next block opens at once (nothing noted stays in the way)
        pass


def _interrupts_at(monkeypatch: pytest.MonkeyPatch, *places: tuple[type, str]) -> None:
    """Raise KeyboardInterrupt as the first call of each of ``places`` (a class and the
    name of its method) starts, one after the other. (Not traced: a trace function that
    raises is taken off, so only the first would land.)"""
    due = list(places)
    for owner, attr in dict.fromkeys(places):
        original = getattr(owner, attr)

        def interrupted(
            *args: Any, _original: Any = original, _place: Any = (owner, attr), **kwargs: Any
        ) -> Any:
            if due and due[0] == _place:
                due.pop(0)
                raise KeyboardInterrupt
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, attr, interrupted)


# (the window of the second interrupt, in the clean-up the first one began)
_CLEAN_UP = {
    "begun": (Acquisition, "abandon"),
    "sending": (SocketConnection, "send"),
    "reading": (SocketConnection, "read"),
}


@pytest.mark.parametrize("kind", ["lock", "semaphore", "write"])
@pytest.mark.parametrize("second", list(_CLEAN_UP))
def test_a_second_interrupt_as_the_first_ones_clean_up_is_on_its_way_leaves_nothing_held(
    r: redis.Redis, name: str, kind: str, second: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first lands as the grant becomes a lease; the second in the clean-up it began
    (the grant given back): the clean-up runs once more. (It was cut, and the name stayed
    granted to nobody until its ttl.)"""
    lock, read_as = _primitive(r, name, kind)
    _interrupts_at(monkeypatch, (Front, "_watched"), _CLEAN_UP[second])
    with pytest.raises(KeyboardInterrupt), lock:
        pytest.fail("the block ran")
    monkeypatch.undo()
    assert _left_held(r, name, read_as) == []


@pytest.mark.parametrize(("function", "nth", "kind"), _cases(_ENDING))
def test_an_interrupt_as_a_block_ends_leaves_nothing_held(
    r: redis.Redis, name: str, function: str, nth: int, kind: str
) -> None:
    lock, read_as = _primitive(r, name, "lock" if kind == "multi" else kind)
    if kind == "multi":
        lock = redlease.MultiLock(r, [name, name + ":b"], ttl=30.0, auto_renew=True)
    try:
        with pytest.raises(KeyboardInterrupt), lock:
            _interrupt_at(function, nth)
    finally:
        sys.settrace(None)
    assert _left_held(r, name, read_as) == []
    with lock:
        pass


def test_an_interrupt_as_a_nested_reentrant_block_ends_keeps_the_outer_hold(
    r: redis.Redis, name: str
) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, reentrant=True)
    with lock as outer:
        try:
            with pytest.raises(KeyboardInterrupt), lock:
                _interrupt_at("LeaseState.check")  # (its inner release's look)
        finally:
            sys.settrace(None)
        assert outer.hold_count == 1
        assert redlease.read_info(r, name).held  # the outer block's hold stands
    assert not redlease.read_info(r, name).held


def test_an_interrupt_before_exit_runs_is_given_back_when_its_statement_runs_again(
    r: redis.Redis, name: str
) -> None:
    """The one point no code of redlease's can cover: an error raised as ``__exit__``
    starts, before its first line. The block's note stays; the next block its holder
    opens at the same statement (or after its frame returned) gives the lease back."""
    names = [f"{name}:{i}" for i in range(2)]
    interrupted = []
    for i, each in enumerate(names):
        lock = redlease.Lock(r, each, ttl=30.0, auto_renew=True)
        try:
            with lock:
                if i == 0:
                    _interrupt_at(type(lock).__exit__.__qualname__)
        except KeyboardInterrupt:
            sys.settrace(None)
            interrupted.append(each)
            assert redlease.read_info(r, each).held  # (redlease had no line to run)
    assert interrupted == names[:1]
    assert [n for n in names if redlease.read_info(r, n).held] == []


@pytest.mark.parametrize("function", ["_released_by_block", "entered_lease", "Lease.__exit__"])
def test_an_interrupt_as_a_reentrant_outer_block_ends_releases_it(
    r: redis.Redis, name: str, function: str
) -> None:
    """Its inner block's release came first (one hold given up): the outer end still
    tells that its own release had not begun, and makes it."""
    lock = redlease.Lock(r, name, ttl=30.0, reentrant=True, auto_renew=True)

    def blocks() -> None:
        with lock:
            with lock:
                pass
            _interrupt_at(function)

    try:
        with pytest.raises(KeyboardInterrupt):
            blocks()
    finally:
        sys.settrace(None)
    assert not redlease.read_info(r, name).held


def test_an_interrupt_as_a_reentrant_inner_block_opens_keeps_the_outer_block_whole(
    r: redis.Redis, name: str
) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, reentrant=True, auto_renew=True)

    def inner() -> None:
        with lock:
            pytest.fail("the inner block ran")

    with lock as outer:
        _interrupt_at("push_entered")
        try:
            with pytest.raises(KeyboardInterrupt):
                inner()
        finally:
            sys.settrace(None)
        assert outer.hold_count == 1
    assert outer.released
    assert not redlease.read_info(r, name).held


def test_leases_entered_outside_a_with_statement_are_never_taken_for_stale(
    r: redis.Redis, name: str
) -> None:
    """``__enter__`` called by an ExitStack, a wrapper or a comprehension is no `with`
    statement of the holder's: blocks opened after it leave its lease alone."""
    import contextlib

    class Wrapper:
        def __init__(self, lock: redlease.Lock) -> None:
            self.lock = lock

        def __enter__(self) -> Any:
            return self.lock.__enter__()

        def __exit__(self, *exc: Any) -> None:
            self.lock.__exit__(*exc)

    locks = [redlease.Lock(r, f"{name}:{i}", ttl=30.0) for i in range(4)]
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(locks[0])
        with Wrapper(locks[1]) as second, locks[2] as third:
            entered_by_hand = [lock.__enter__() for lock in locks[3:]]
            for _ in range(2):  # the same with statement, run again
                with redlease.Lock(r, f"{name}:loop", ttl=30.0):
                    pass
            held = [first, second, third, *entered_by_hand]
            assert [lease.released for lease in held] == [False] * 4
            assert all(redlease.read_info(r, lease.name).held for lease in held)
        locks[3].__exit__(None, None, None)
    assert not any(redlease.read_info(r, lock.name).held for lock in locks)


@pytest.mark.parametrize(
    ("function", "at"),
    [("Pool.give", "call"), ("Pool.take", "return"), ("SocketConnection.send", "call")],
)
def test_connections_dropped_by_interrupts_are_neither_counted_nor_left_open(
    server: servers.ServerProcess, name: str, function: str, at: str
) -> None:
    """More interrupts than a pool has connections (128), each as a connection is taken
    or given back: the pool is not used up (the next call gets one at once, not "all
    busy" after its timeout) and the dropped ones were closed."""
    r = redis.Redis(port=server.port)  # a pool of its own
    before = len(r.client_list())
    interrupted = 0
    for i in range(150):
        lock = redlease.Lock(r, f"{name}:{i}", ttl=30.0)
        _interrupt_at(function, at=at)
        try:
            lock.try_acquire()
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            sys.settrace(None)
    assert interrupted == 150
    lease = redlease.Lock(r, name, ttl=30.0).acquire(timeout=0.5)
    lease.release()
    assert len(r.client_list()) <= before + 8  # (redlease keeps at most 8 idle)
    r.close()


def _interrupt_after(noted: str) -> list[str]:
    """Raise KeyboardInterrupt as the first function called after ``noted`` returns
    starts, up to the return of the ``__enter__`` that called it (after which the `with`
    statement holds the lease, and its ``__exit__`` ends the block). Returns where it was
    raised (empty: nowhere)."""
    armed, landed, enter = False, list[str](), list[Any]()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal armed
        name = frame.f_code.co_name
        if event == "call":
            if armed:
                sys.settrace(None)
                landed.append(name)
                raise KeyboardInterrupt
            if not enter and name == "__enter__":
                enter.append(frame)  # the block's own (the first called)
                return tracer
            return tracer if name == noted else None
        if event == "return":
            if name == noted:
                armed = True
            elif enter and frame is enter[0]:
                sys.settrace(None)
        return tracer

    sys.settrace(tracer)
    return landed


@pytest.mark.parametrize("kind", ["lock", "reentrant", "semaphore", "write", "multi", "once"])
def test_an_interrupt_as_enter_returns_its_lease_leaves_nothing_held(
    r: redis.Redis, name: str, kind: str
) -> None:
    """The block is noted and its lease renewed before its ``__enter__`` returns, and the
    `with` statement calls no ``__exit__`` when that raises: an interrupt at any call in
    between (a signal handler's error, as the call starts) still ends the block."""
    lock, read_as = _primitive(r, name, kind)
    landed = _interrupt_after("push_entered")
    try:
        with lock:
            pytest.fail("the block ran")
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    assert landed  # (it landed: a call follows the note)
    assert _left_held(r, name, read_as) == [], f"interrupted as {landed} started"
    with lock:  # and the next block opens at once
        pass
