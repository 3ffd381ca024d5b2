"""A lock's front without its I/O: each lock object's rules (``FrontCore``: its spec and
options, reentrant holds, metrics, the attempt it makes) and the `with` blocks open in
this context, with the refusal of a nested block that would wait for itself. The front
itself (``acquire``, ``try_acquire``, ``with``) is ``_async.front`` (and its generated
twin); its decorators are each backend's ``guarded``, refusing what
``_rules.decorate`` refuses.

``with lock as lease`` remembers the lease it opened in a context variable (per thread,
per task), so nested and concurrent blocks each release their own.

A ``reentrant`` lock keeps a table of the leases it handed out by holder (the thread, or
the asyncio task, that acquired): an acquire by a holder returns its lease again, one
hold more (``hold_count``), and only the release of the last hold goes to the server.

A front holds a ``FrontCore``: its lock's rules (spec, options, holds, metrics, the
attempt it makes), as an object, so that each public class is its front and nothing more.
"""

from __future__ import annotations

import dis
import functools
from collections.abc import Callable, Generator
from contextvars import ContextVar
from types import CodeType, FrameType
from typing import Any, NamedTuple, Protocol, TypeVar

from .._base import metrics as _metrics
from .._base.errors import LockError, LockLost
from .._base.types import OnLost
from . import arguments as args
from . import inspect as _inspect
from .flows import Acquisition, Flow, Grant, LockSpec
from .inspect import LockInfo
from .lease import HandedOut, Holders, LeaseState, release_calls


class Attempt(Protocol):
    """One caller's try to take a lock (``_rules.flows.Acquisition``, ``_rules.quorum``'s twin)."""

    @property
    def outstanding(self) -> bool:
        """Whether ``abandon()`` is needed if the attempt is interrupted."""

    def settings_within(self) -> float | None:
        """How long the look at the server's settings may take first (None: its own)."""

    def run(self) -> Generator[Any, Any, Grant | None]: ...

    def abandon(self, *, hurried: bool = False) -> Generator[Any, Any, None]: ...


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


def refuse_nested(lock: object, core: FrontCore, holder: object) -> None:
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
                f"{core.noun} {core.name!r} is held already by an enclosing `with` block "
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


def tidy_entered() -> None:
    """Drop the closed entries (a block's end, last)."""
    stack = _entered.get()
    kept = tuple(entry for entry in stack if entry[_OPEN])
    if len(kept) != len(stack):
        _entered.set(kept)


CoreT = TypeVar("CoreT", bound="FrontCore")


class FrontCore:
    """One lock object's rules, without I/O, held by its front (``_async.front``): its
    spec and options, the leases its holders took, whether a nested block is refused,
    what its metrics and errors call it, the attempt it makes and the look that answers
    ``locked()``, ``owned()`` and ``waiting()``. A read/write lock's side and a Redlock
    hold a core of their own kind (``_rules.rwlock``, ``_rules.redlock``)."""

    _acquired: HandedOut | None = None  # (made at the first acquire: see acquirers)

    def __init__(
        self,
        spec: LockSpec,
        *,
        auto_renew: bool = False,
        max_hold: float | None = None,
        on_lost: OnLost | None = None,
        reentrant: bool = False,
        refuses_nesting: bool = False,
        watches: bool = False,
        cancel_on_lost: bool = False,
        noun: str = "lock",
        kind: str = "lock",
        mode: str | None = None,
    ) -> None:
        self.spec = spec
        self.auto_renew, self.max_hold = auto_renew, max_hold
        self.on_lost = on_lost
        # reentrant: each holder's lease (an acquire by its holder is one hold more)
        self.holding: Holders | None = Holders() if reentrant else None
        self.refuses_nesting = refuses_nesting  # see refuse_nested
        self.watches = watches  # without auto_renew: validity watched, to tell on_lost
        self.cancel_on_lost = cancel_on_lost  # (asyncio's)
        self.noun = noun  # what errors call it
        # What its metrics call it (``redlease.kind``, ``redlease.mode``), and the
        # attribute sets made for them (see ``_base.metrics.Labels``).
        self.kind, self.mode = kind, mode
        self._labels: _metrics.Labels | None = None

    @classmethod
    def checked(
        cls: type[CoreT],
        spec: LockSpec,
        auto_renew: object,
        max_hold: object,
        on_lost: object,
        clock: object,
        reentrant: object = False,
        cancel_on_lost: object = False,
        **rest: Any,
    ) -> CoreT:
        """A core of the options a lock's caller gave (each checked: ``_rules.arguments``;
        ``clock``, the caller's, says whether renewal may be had)."""
        renews, bound = args.renewal(auto_renew, max_hold, clock)
        return cls(
            spec,
            auto_renew=renews,
            max_hold=bound,
            on_lost=args.callback(on_lost, "on_lost"),  # type: ignore[arg-type]
            reentrant=args.flag(reentrant, "reentrant"),
            cancel_on_lost=args.flag(cancel_on_lost, "cancel_on_lost"),
            **rest,
        )

    @property
    def name(self) -> str:
        return self.spec.name

    def new_attempt(
        self, timeout: float | None, *, wait: bool, holder: Callable[[], object]
    ) -> Attempt:
        """The attempt an acquire makes (``holder`` says who asks, for the kinds it matters to)."""
        return Acquisition(self.spec, timeout, wait=wait)

    def new_state(self, grant: Grant) -> LeaseState:
        """The rules of the lease of ``grant`` (a one-server lease's)."""
        return LeaseState(self.spec, grant, self.on_lost)

    def refused(self, holder: Callable[[], object], *, wait: bool) -> None:
        """Told that an acquire got nothing: the kinds that must raise then do."""

    def held_by(self, holder: object) -> LeaseState | None:
        """The lease ``holder`` holds already (a reentrant lock's), with one hold more.
        A lease found lost is dropped from the table and reported: the work it
        protects is no longer protected, and a new lease would hide that."""
        holding = self.holding
        lease = None if holding is None else holding.held(holder)
        if lease is None:
            return None
        assert holding is not None
        if lease.lost():
            holding.left(holder, lease)
            raise LockLost(
                f"lease on {self.name!r} that this holder acquired before was lost: {lease.reason}"
            )
        lease.hold_again()
        return lease

    def hold(self, holder: object, lease: LeaseState) -> None:
        if self.holding is not None:
            self.holding.hold(holder, lease)

    def acquirers(self) -> HandedOut:
        """Every lease handed out, by the holder that acquired it (``owned()``)."""
        acquired = self._acquired
        if acquired is None:  # (setdefault: two threads' first acquires keep one table)
            acquired = self.__dict__.setdefault("_acquired", HandedOut())
        return acquired

    def look(self) -> Flow[LockInfo]:
        """What the server says of the name: its holders and waiters (``_rules.inspect``)."""
        spec = self.spec
        kind = _inspect.kind_of(spec.kind)
        return _inspect.inspect(spec.keys, spec.name, kind, spec.reply_timeout)

    def metered(self) -> _metrics.Labels | None:
        of = _metrics.instruments()
        if of is None:
            return None
        labels = self._labels
        if labels is None or labels.of is not of:  # first use, or configured anew
            labels = self._labels = of.labels(self.kind, self.mode, self.name)
        return labels

    def opened(self, lease: LeaseState, started: float) -> None:
        """A lease handed out by an acquire that started at ``started``: granted by the
        server, or one name's of a multi-lock's single script (each counts as an
        acquisition)."""
        labels = self.metered()
        if labels is not None:
            lease.metered(labels, labels.granted(started))

    def not_granted(self, started: float, *, wait: bool) -> None:
        labels = self.metered()
        if labels is not None:
            labels.not_granted(started, waited=wait)
