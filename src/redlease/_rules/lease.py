"""Leases: one successful acquisition each. Ownership belongs to the lease (its token),
never to a thread or task, so a lease may be handed to another thread and released there.

``LeaseState`` holds everything that needs no I/O: validity, the lost flag and the
one-time ``on_lost`` notification; the lease of ``_async.front`` (and its generated
twin) holds one and adds ``extend``, ``release`` and ``with``. Also here, where leases are
kept: by holder (``Holders``, ``HandedOut``: reentrant holds, ``owned()``), and by the
`with` block that opened them (``with lock as lease`` notes its lease in a context
variable, per thread, per task, so nested and concurrent blocks each release their own,
and a nested block that would wait for itself is refused).
"""

from __future__ import annotations

import dis
import functools
import logging
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from types import CodeType, FrameType, TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from .._base import fork as _fork
from .._base.errors import LockError, LockLost, QuorumError
from . import arguments as args
from . import flows as _flows

if TYPE_CHECKING:
    from .._base.metrics import Labels

log = logging.getLogger(__name__)

SHOWN = 8  # characters of a token shown: enough to tell holders apart, useless to release


def short_token(token: str) -> str:
    """A token as logs, messages and the command line show it: its first characters
    only. The whole token is what releases or extends a lease (``release --force``
    aside), so it never leaves the process in text anyone may read."""
    return token[:SHOWN] + "…" if len(token) > SHOWN else token


HELD, RELEASED, LOST = "held", "released", "lost"

# Guards state transitions of all leases (held -> released | lost): they are rare and
# short, and one process-wide lock keeps each lease cheap to create on the hot path.
_TRANSITIONS = _fork.thread_lock()


class LeaseState:
    """What a holder's lease knows without asking the server: its token, fence and
    validity, its holds, whether it is held, released or lost, and the one-time
    ``on_lost`` notification. The lease a caller holds (``_async.front``) holds one, as
    its rules; the library's fronts, renewers and tables work on this object. Its
    subclasses are a Redlock lease's (``_rules.redlock``) and a scheduled run's
    (``_rules.once``): other extend and release flows."""

    # Why it is lost when its hold's end comes (the renewer stopped at max_hold, or, a
    # scheduled job's, at_most) and its validity runs out.
    held_out = "renewal stopped at max_hold and its validity ran out"
    # Set by the front when metrics are recorded: the lock's attribute sets, and when
    # the hold started (its end is recorded by mark_released / mark_lost).
    labels: Labels | None = None
    since = 0.0
    # Calls of release() so far, counted as its first step: a block's end that is
    # interrupted tells from it whether the release had begun (and finishes it then).
    release_calls = 0
    # Told of a loss besides on_lost (asyncio's cancel_on_lost: the task to cancel).
    also_told: Callable[[str], None] | None = None

    def __init__(
        self,
        spec: _flows.LockSpec,
        grant: _flows.Grant,
        on_lost: Callable[[Any], object] | None,
    ) -> None:
        self.spec = spec
        self.token = grant.token
        self.fence = grant.fence
        self.valid_until = grant.valid_until
        self.unsure = grant.unsure  # (see Grant: its release marks the attempt given up)
        self.on_lost = on_lost
        self.status = HELD
        self.reason: str | None = None  # why it was lost
        # Set by the renewer that watches this lease: called once it is released or lost.
        self.unwatch: Callable[[], None] | None = None
        self.generation = _fork.generation  # a fork's child never holds it
        self.holds = 1  # acquisitions not yet released (a reentrant lock's nest them)
        # The table of leases by holder this one is in (reentrant, read/write), and its
        # holder there.
        self.held_in: tuple[Holders, weakref.ref[Any]] | None = None
        # The lease that holds this state: what on_lost is told of, what a holder's
        # table hands back. Let go of once released, so that the two, which refer to
        # each other, go with their last reference rather than with the next collection.
        self.lease: Any = None

    @property
    def name(self) -> str:
        return self.spec.name

    def remaining(self) -> float:
        """Seconds of validity left (0.0 once expired, released or lost)."""
        if self.status != HELD:
            return 0.0
        return max(0.0, self.valid_until - self.spec.clock())

    def lost(self) -> bool:
        """Whether it is known gone or its validity has run out (which it then records)."""
        if self.status == HELD:
            if self.generation != _fork.generation:
                self.forked()
            elif self.spec.clock() >= self.valid_until:
                self.mark_lost("its validity ran out")
        return self.status == LOST

    def is_held(self) -> bool:
        """Neither released nor known lost (no look at the clock, unlike ``lost``)."""
        return self.status == HELD

    def hold_count(self) -> int:
        return self.holds if self.status == HELD else 0

    def check(self) -> None:
        """Raise LockLost unless it is still held and valid."""
        if self.lost():
            raise LockLost(f"lease on {self.name!r} was lost: {self.reason}")
        if self.status == RELEASED:
            raise LockLost(f"lease on {self.name!r} was released")

    def hold_again(self) -> None:
        """A reentrant lease acquired again by its holder: one hold more."""
        self.holds += 1

    def drop_hold(self) -> None:
        """The hold ``hold_again`` took, given up before its caller had it."""
        self.holds -= 1

    def metered(self, labels: Labels, since: float) -> None:
        """Record the end of its hold in ``labels``; it started at ``since``."""
        self.labels, self.since = labels, since

    def leave_table(self) -> None:
        """Released, or found lost by its release: out of its holder table, if in one."""
        held, self.held_in = self.held_in, None
        if held is not None:
            holder = held[1]()
            if holder is not None:
                held[0].left(holder, self)

    def renewed(self, valid_until: float) -> None:
        with _TRANSITIONS:
            if self.status == HELD:
                self.valid_until = valid_until

    def mark_lost(self, reason: str) -> bool:
        """Record the loss and tell the holder's callback, exactly once (True that time)."""
        with _TRANSITIONS:
            if self.status != HELD:
                return False
            self.status, self.reason = LOST, reason
        self.stop_watching()
        # Said here, once per lease, whoever found it (the renewer, a check, a release):
        # with the token's first characters, as `redlease inspect` shows holders.
        log.warning("lease on %r (%s) was lost: %s", self.name, short_token(self.token), reason)
        if self.labels is not None:
            self.labels.ended(self.since, lost=True)
        if self.on_lost is not None:
            try:
                self.on_lost(self if self.lease is None else self.lease)
            except Exception:
                log.exception(
                    "on_lost callback for lock %r (%s) raised", self.name, short_token(self.token)
                )
        if self.also_told is not None:
            self.also_told(reason)
        return True

    def mark_released(self) -> None:
        """Released (or never handed to its caller: its renewal and watch stop, its
        metrics end; the caller gives its grant back on the server)."""
        with _TRANSITIONS:
            if self.status != HELD:
                return
            self.status = RELEASED
        self.lease = None
        self.stop_watching()
        self.leave_table()
        if self.labels is not None:
            self.labels.ended(self.since, lost=False)

    # The flows a lease's driver runs to extend and release it, the renewer's included
    # (``wait``: its bound): a single server's here; the subclasses give theirs.
    def extend_flow(self, ttl_ms: int, wait: float | None = None) -> Any:
        return _flows.extend(self.spec, self.token, ttl_ms, wait)

    def release_flow(self, *, hurried: bool = False) -> Any:
        """The flow that releases it (``hurried``: bounded, see ``_rules.flows.release``)."""
        return _flows.release(self.spec, self.token, hurried=hurried, unsure=self.unsure)

    def lost_on_lock_lost(self) -> _Ending:
        """Around a round trip that may find the lease gone: LockLost marks it lost (and
        tells ``on_lost``) before it propagates."""
        return _Ending(self, release=False)

    def releasing(self) -> _Ending:
        """Around a release: how it ends sets the state. LockLost: it was lost before;
        QuorumError: released all the same (what is left expires with the ttl)."""
        return _Ending(self, release=True)

    def watched(self, unwatch: Callable[[], None]) -> None:
        """A renewer watches it: ``unwatch`` is called once it is released or lost."""
        self.unwatch = unwatch

    def stop_watching(self) -> None:
        unwatch, self.unwatch = self.unwatch, None
        if unwatch is not None:
            unwatch()

    def not_forked(self) -> None:
        """Raise LockLost in a fork's child (before anything is sent): the lease is the
        parent's, and the child must neither release nor extend it."""
        if self.generation != _fork.generation:
            self.forked()
            raise LockLost(
                f"lease on {self.name!r} belongs to the process this one was forked from"
            )

    def forked(self) -> None:
        """In a child after ``fork``: the lease is the parent's, never the child's (no
        callback runs: the child never held it)."""
        self.unwatch = None
        if self.status == HELD:
            self.status = LOST
            self.reason = "this process is a fork of the one that holds it"

    def extend_ttl_ms(self, ttl: object) -> int:
        return self.spec.ttl_ms if ttl is None else args.ttl_ms(ttl)

    def described(self, kind: str) -> str:
        """What the lease of ``kind`` (its class's name) shows of itself."""
        return (
            f"<{kind} {self.name!r} fence={self.fence} {self.status} "
            f"remaining={self.remaining():.3f}s>"
        )

    def __repr__(self) -> str:
        return self.described(type(self).__name__)


class _Ending:
    """The context of ``lost_on_lock_lost`` and ``releasing``: a plain class, as a
    generator-based context manager costs more than the rule it carries."""

    __slots__ = ("lease", "release")

    def __init__(self, lease: LeaseState, *, release: bool) -> None:
        self.lease, self.release = lease, release

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # the exception, if any, goes on
        if exc_type is not None and issubclass(exc_type, LockLost):
            self.lease.mark_lost(str(exc))
            if self.release:
                self.lease.leave_table()  # its holder has been told, here
        elif self.release and (exc_type is None or issubclass(exc_type, QuorumError)):
            self.lease.mark_released()
        elif self.release:
            # A release that failed (the server out of reach): the lease may still be
            # held there, but its holder has let go of it. Its renewal stops, so that
            # it expires with its ttl if a release sent again does not reach the server
            # either, and its holder's next acquire is a new one, not a re-entry into a
            # lease it no longer protects.
            self.lease.stop_watching()
            self.lease.leave_table()


def release_calls(held: object) -> int:
    """How often a lease's ``release()`` has been called (0 for anything else): a
    block's end that is interrupted tells from it whether the release had begun."""
    return held.release_calls if isinstance(held, LeaseState) else 0


class Holders:
    """Leases by holder (a thread, or an asyncio task), for the locks that must know what
    a holder holds already: a reentrant lock, a read/write lock. Weak: a holder that ends
    without releasing leaves no entry once it is gone. A lease leaves when released (or
    found lost by its release); one lost otherwise stays, for its holder to be told."""

    def __init__(self) -> None:
        self._table: weakref.WeakKeyDictionary[Any, LeaseState] = weakref.WeakKeyDictionary()

    def held(self, holder: object) -> LeaseState | None:
        """The lease ``holder`` holds (perhaps lost), or None. A fork's child holds none
        of its parent's leases; None (asyncio code run outside a task) holds none."""
        lease = None if holder is None else self._table.get(holder)
        if lease is not None and (lease.status == RELEASED or lease.generation != _fork.generation):
            self.left(holder, lease)
            return None
        return lease

    def hold(self, holder: object, lease: LeaseState) -> None:
        if holder is None:  # (nobody to hold it again: see held)
            return
        self._table[holder] = lease
        lease.held_in = (self, weakref.ref(holder))

    def left(self, holder: object, lease: LeaseState) -> None:
        if holder is not None and self._table.get(holder) is lease:
            del self._table[holder]


class HandedOut:
    """Every lease a lock object handed out, by the holder (thread, or asyncio task) that
    acquired it: what ``owned()`` asks the server about. Weak both ways: neither a
    holder nor a lease is kept alive by being here. Each holder adds to its own set only,
    so holders in different threads never touch the same set."""

    def __init__(self) -> None:
        self._table: weakref.WeakKeyDictionary[Any, weakref.WeakSet[LeaseState]] = (
            weakref.WeakKeyDictionary()
        )

    def note(self, holder: object, lease: LeaseState) -> None:
        if holder is None:  # (asyncio code run outside a task: nobody to own it)
            return
        leases = self._table.get(holder)
        if leases is None:
            leases = self._table[holder] = weakref.WeakSet()
        leases.add(lease)

    def tokens(self, holder: object) -> set[str]:
        """The tokens of the leases ``holder`` acquired and still holds, as far as it
        knows here (not released, not lost, not a fork's parent's)."""
        leases = None if holder is None else self._table.get(holder)
        if not leases:
            return set()
        return {
            lease.token for lease in list(leases) if not (lease.status == RELEASED or lease.lost())
        }


def lost_at_block_end(lease: LeaseState, lost: LockLost, failure: BaseException | None) -> None:
    """A lease found lost when its ``with`` block ends is an error only if the block itself
    succeeded: otherwise the block's own exception is the one the caller needs to see."""
    if failure is None:
        raise lost
    log.warning(
        "lease on %r (%s) was lost before the block that held it failed",
        lease.name,
        short_token(lease.token),
    )


# ------------------------------------------------------------- leases by `with` block

# Leases opened by `with lock` / `async with lock` in this context, innermost last, each
# an entry [lock, lease, the hold count it had when the block took it, the holder (thread,
# or task) that took it, open, the frame and instruction of its `with` statement, its
# lease's release count when the block's end began]: a task started inside a block
# copies the context, not the holding. A block's end closes its entry before anything
# else (``close_entered``), in one step an interrupt cannot split, and drops closed
# entries last (``tidy_entered``): so the entry of a block interrupted at any point is
# either still open, and found again by the clean-up, or closed and in the clean-up's
# hands. One point is out of reach: an error a signal handler raises as ``__exit__``
# starts (CPython runs handlers as a function begins), before its first line; that
# block's entry stays open, and ``stale_entered`` finds it.
_Entry = list[Any]
_entered: ContextVar[tuple[_Entry, ...]] = ContextVar("redlease_entered", default=())
_LOCK, _LEASE, _DEPTH, _HOLDER, _OPEN, _FRAME, _LASTI, _CALLS = range(8)
# The instructions that call __enter__ / __aenter__ for a `with` / `async with` statement
# (3.10's, 3.11's and later); an async one is awaited within the next few instructions.
_WITH = frozenset({"SETUP_WITH", "BEFORE_WITH"})
_ASYNC_WITH = "BEFORE_ASYNC_WITH"
_AWAITED_WITHIN = 4


class Opening(NamedTuple):
    """A `with` block being opened: by whom (the thread, or the task), and where (the
    frame running its `with` statement, and that statement's instruction; None and -1
    when ``__enter__`` was called otherwise: by an ExitStack, a wrapper, a comprehension)."""

    holder: object
    frame: FrameType | None
    lasti: int


def opening(holder: object, frame: FrameType | None) -> Opening:
    """``holder``'s block opened from ``frame`` (the caller of ``__enter__``)."""
    if frame is None or not _a_with_statement(frame.f_code, frame.f_lasti):
        return Opening(holder, None, -1)
    return Opening(holder, frame, frame.f_lasti)


@functools.lru_cache(maxsize=1024)
def _a_with_statement(code: CodeType, lasti: int) -> bool:
    """Whether the instruction at ``lasti`` of ``code`` is (or awaits) a `with`
    statement's call of ``__enter__``."""
    instructions = list(dis.get_instructions(code))
    for at, instruction in enumerate(instructions):
        if instruction.offset == lasti:
            if instruction.opname in _WITH:
                return True
            before = instructions[max(0, at - _AWAITED_WITHIN) : at + 1]
            return any(x.opname == _ASYNC_WITH for x in before)
    return False


def entered(lock: object, lease: Any, at: Opening) -> _Entry:
    """The entry of a block of ``lock`` that took ``lease`` (or a MultiLock's leases),
    made before it is noted (``push_entered``), so that whoever notes it can take back
    exactly that note (``forget_entered``)."""
    depth = lease.holds if isinstance(lease, LeaseState) else 1  # (a multi-lease nests not)
    return [lock, lease, depth, at.holder, True, at.frame, at.lasti, 0]


def push_entered(entry: _Entry) -> None:
    """Note a block's entry (``entered``)."""
    _entered.set((*_entered.get(), entry))


def forget_entered(entry: _Entry) -> None:
    """A block that never began (its ``__enter__`` was interrupted around noting it):
    its entry, if it was noted, is closed and dropped."""
    entry[_OPEN] = False
    tidy_entered()


def stale_entered(at: Opening) -> list[_Entry]:
    """The entries of the blocks of ``at``'s holder whose end was interrupted before its
    first line (see ``_entered``): such a block is over once the `with` statement that
    opened it is opened again in the same frame (a loop's next turn). They stay open
    until the caller has given back what they hold (``entered_lease``) and closed them
    (``close_stale``): an interruption meanwhile leaves them to be found again. (A block
    whose ``__enter__`` was not called by a `with` statement is never judged so.)"""
    if at.frame is None:
        return []
    return [
        entry
        for entry in _entered.get()
        if entry[_OPEN]
        and entry[_HOLDER] is at.holder
        and entry[_FRAME] is at.frame
        and entry[_LASTI] == at.lasti
    ]


def close_stale(entry: _Entry) -> None:
    """A stale block's entry, once what it held is given back: closed and dropped."""
    entry[_OPEN] = False
    tidy_entered()


def refuse_nested(lock: object, noun: str, name: str, holder: object) -> None:
    """A `with` block of a lock that is not reentrant, inside a block of the same object
    whose lease ``holder`` still holds, would wait for that lease (until its ttl runs out,
    then take a lock its outer block believes it holds): refused at once, as
    python-redis-lock refuses a second acquire of one lock object."""
    for entry in _entered.get():
        lease = entry[_LEASE]
        if entry[_LOCK] is lock and entry[_HOLDER] is holder and entry[_OPEN]:
            if not lease.is_held() or lease.lost():
                continue
            raise LockError(
                f"{noun} {name!r} is held already by an enclosing `with` block "
                "of the same object in this thread (asyncio: task); a nested block would "
                "wait for it until its ttl ran out. Make the lock with reentrant=True to "
                "re-enter it, or release the outer lease first"
            )


def close_entered(lock: object, *, missing_ok: bool = False) -> _Entry | None:
    """The entry of the innermost open block of ``lock``, closed: its block is ending.
    Its lease's release count is kept in it first (``release_begun``). None if there is
    none and ``missing_ok`` (an interrupted block's clean-up)."""
    stack = _entered.get()
    for i in range(len(stack) - 1, -1, -1):
        entry = stack[i]
        if entry[_LOCK] is lock and entry[_OPEN]:
            calls = release_calls(entry[_LEASE])
            entry[_CALLS] = calls  # (kept, closed and returned with no call between)
            entry[_OPEN] = False
            return entry
    if missing_ok:
        return None
    raise RuntimeError("exiting a lock's `with` block that did not enter it")


def release_begun(entry: _Entry) -> bool:
    """Whether the release of a closed block's lease has begun since its end began."""
    return release_calls(entry[_LEASE]) != int(entry[_CALLS])


def entered_lease(entry: _Entry | None) -> Any:
    """The lease a closed block of ours is to release; None if none is (its hold was
    released already inside the block: a reentrant lease, whose release now would take
    the hold of an outer block)."""
    if entry is None:
        return None
    lease, depth = entry[_LEASE], entry[_DEPTH]
    if isinstance(lease, LeaseState) and depth > 1 and lease.holds < depth:
        return None
    return lease


def handlers_run() -> None:
    """Nothing: a call, whose start is where CPython runs pending signal handlers (a
    block's ``__enter__`` makes it last, inside a try that ends the block)."""


def tidy_entered() -> None:
    """Drop the closed entries (a block's end, last)."""
    stack = _entered.get()
    kept = tuple(entry for entry in stack if entry[_OPEN])
    if len(kept) != len(stack):
        _entered.set(kept)
