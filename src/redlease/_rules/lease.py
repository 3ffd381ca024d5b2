"""Leases: one successful acquisition each. Ownership belongs to the lease (its token),
never to a thread or task, so a lease may be handed to another thread and released there.

``LeaseState`` holds everything that needs no I/O: validity, the lost flag and the
one-time ``on_lost`` notification; ``_async.lease`` (and its generated twin)
adds ``extend``, ``release`` and ``with``. Also here: the tables of leases by
holder (``Holders``, ``Acquired``).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._base import fork as _fork
from .._base.errors import LockLost, QuorumError
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
    """What a holder knows about its lease without asking the server."""

    # Why it is lost when its hold's end comes (the renewer stopped at max_hold, or, a
    # scheduled job's, at_most) and its validity runs out.
    _held_out = "renewal stopped at max_hold and its validity ran out"
    # Set by the front when metrics are recorded: the lock's attribute sets, and when
    # the hold started (its end is recorded by _mark_released / _mark_lost).
    _labels: Labels | None = None
    _since = 0.0
    # Calls of release() so far, counted as its first step: a block's end that is
    # interrupted tells from it whether the release had begun (and finishes it then).
    _release_calls = 0

    def __init__(
        self,
        spec: _flows.LockSpec,
        grant: _flows.Grant,
        on_lost: Callable[[Any], object] | None,
    ) -> None:
        self._spec = spec
        self._token = grant.token
        self._fence = grant.fence
        self._valid_until = grant.valid_until
        self._on_lost = on_lost
        self._state = HELD
        self._lost_reason: str | None = None
        # Set by the renewer that watches this lease: called once it is released or lost.
        self._unwatch: Callable[[], None] | None = None
        self._generation = _fork.generation  # a fork's child never holds it
        self._holds = 1  # acquisitions not yet released (a reentrant lock's nest them)
        # The table of leases by holder this one is in (reentrant, read/write), and its
        # holder there.
        self._held_in: tuple[Holders, weakref.ref[Any]] | None = None

    @property
    def name(self) -> str:
        """The name of the lock this lease is for."""
        return self._spec.name

    @property
    def token(self) -> str:
        """The random value that proves ownership on the server."""
        return self._token

    @property
    def fence(self) -> int:
        """Fencing token: strictly greater than any earlier grant's for this name."""
        return self._fence

    @property
    def valid_until(self) -> float:
        """End of validity on the lock's monotonic clock."""
        return self._valid_until

    def remaining(self) -> float:
        """Seconds of validity left (0.0 once expired, released or lost), by this
        process's clock, drift margin taken off. Never raises."""
        if self._state != HELD:
            return 0.0
        return max(0.0, self._valid_until - self._spec.clock())

    @property
    def lost(self) -> bool:
        """True once the lease is known gone or its validity has run out (not after release)."""
        if self._state == HELD:
            if self._generation != _fork.generation:
                self._forked()
            elif self._spec.clock() >= self._valid_until:
                self._mark_lost("its validity ran out")
        return self._state == LOST

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost, in words: the server said it is no longer ours
        (expired, or taken over: ``redlease release --force``, a failover), its renewals
        failed until its validity ran out, renewal stopped at ``max_hold``... None while
        it is not lost."""
        return self._lost_reason if self.lost else None

    @property
    def released(self) -> bool:
        """True once released (``release()``, or the end of its ``with`` block)."""
        return self._state == RELEASED

    @property
    def hold_count(self) -> int:
        """How many acquisitions this lease stands for and that are not released yet: 1,
        or more when a ``reentrant`` lock was acquired again by the thread (task) that
        holds it. Only the release of the last one releases on the server."""
        return self._holds if self._state == HELD else 0

    def _leave_table(self) -> None:
        """Released, or found lost by its release: out of its holder table, if in one."""
        held, self._held_in = self._held_in, None
        if held is not None:
            holder = held[1]()
            if holder is not None:
                held[0].left(holder, self)

    def check(self) -> None:
        """Raise LockLost unless the lease is still held and valid: call it before each
        step of protected work (and pass ``fence`` to the resource when it can check it)."""
        if self.lost:
            raise LockLost(f"lease on {self.name!r} was lost: {self._lost_reason}")
        if self._state == RELEASED:
            raise LockLost(f"lease on {self.name!r} was released")

    def _renewed(self, valid_until: float) -> None:
        with _TRANSITIONS:
            if self._state == HELD:
                self._valid_until = valid_until

    def _mark_lost(self, reason: str) -> bool:
        """Record the loss and tell the holder's callback, exactly once (True that time)."""
        with _TRANSITIONS:
            if self._state != HELD:
                return False
            self._state, self._lost_reason = LOST, reason
        self._stop_watching()
        # Said here, once per lease, whoever found it (the renewer, a check, a release):
        # with the token's first characters, as `redlease inspect` shows holders.
        log.warning("lease on %r (%s) was lost: %s", self.name, short_token(self._token), reason)
        if self._labels is not None:
            self._labels.ended(self._since, lost=True)
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception(
                    "on_lost callback for lock %r (%s) raised", self.name, short_token(self._token)
                )
        return True

    def _mark_released(self) -> None:
        with _TRANSITIONS:
            if self._state != HELD:
                return
            self._state = RELEASED
        self._stop_watching()
        self._leave_table()
        if self._labels is not None:
            self._labels.ended(self._since, lost=False)

    # The flows a lease's driver runs to extend and release it, the renewer's included
    # (``wait``: its bound): a single server's here; a Redlock lease gives the quorum ones.
    def _extend_flow(self, ttl_ms: int, wait: float | None = None) -> Any:
        return _flows.extend(self._spec, self._token, ttl_ms, wait)

    def _release_flow(self, *, hurried: bool = False) -> Any:
        return _flows.release(self._spec, self._token, hurried=hurried)

    def _lost_on_lock_lost(self) -> _Ending:
        """Around a round trip that may find the lease gone: LockLost marks it lost (and
        tells ``on_lost``) before it propagates."""
        return _Ending(self, release=False)

    def _releasing(self) -> _Ending:
        """Around a release: how it ends sets the state. LockLost: it was lost before;
        QuorumError: released all the same (what is left expires with the ttl)."""
        return _Ending(self, release=True)

    def _stop_watching(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()

    def _not_forked(self) -> None:
        """Raise LockLost in a fork's child (before anything is sent): the lease is the
        parent's, and the child must neither release nor extend it."""
        if self._generation != _fork.generation:
            self._forked()
            raise LockLost(
                f"lease on {self.name!r} belongs to the process this one was forked from"
            )

    def _forked(self) -> None:
        """In a child after ``fork``: the lease is the parent's, never the child's (no
        callback runs: the child never held it)."""
        self._unwatch = None
        if self._state == HELD:
            self._state = LOST
            self._lost_reason = "this process is a fork of the one that holds it"

    def _extend_ttl_ms(self, ttl: object) -> int:
        return self._spec.ttl_ms if ttl is None else args.ttl_ms(ttl)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} fence={self._fence} {self._state} "
            f"remaining={self.remaining():.3f}s>"
        )


class _Ending:
    """The context of ``_lost_on_lock_lost`` and ``_releasing``: a plain class, as a
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
            self.lease._mark_lost(str(exc))
            if self.release:
                self.lease._leave_table()  # its holder has been told, here
        elif self.release and (exc_type is None or issubclass(exc_type, QuorumError)):
            self.lease._mark_released()
        elif self.release:
            # A release that failed (the server out of reach): the lease may still be
            # held there, but its holder has let go of it. Its renewal stops, so that
            # it expires with its ttl if a release sent again does not reach the server
            # either, and its holder's next acquire is a new one, not a re-entry into a
            # lease it no longer protects.
            self.lease._stop_watching()
            self.lease._leave_table()


# The library's own hands on a lease: what its fronts and renewers do to one, through
# names a holder never sees on the lease itself.


def spec_of(lease: LeaseState) -> _flows.LockSpec:
    return lease._spec


def is_held(lease: LeaseState) -> bool:
    """Neither released nor known lost (no look at the clock, unlike ``lease.lost``)."""
    return lease._state == HELD


def holds(lease: LeaseState) -> int:
    """Its holds not yet released, lost or not (``hold_count`` says 0 once it is lost)."""
    return lease._holds


def hold_again(lease: LeaseState) -> None:
    """A reentrant lease acquired again by its holder: one hold more."""
    lease._holds += 1


def release_calls(held: object) -> int:
    """How often a lease's ``release()`` has been called (0 for anything else): a
    block's end that is interrupted tells from it whether the release had begun."""
    return held._release_calls if isinstance(held, LeaseState) else 0


def drop_hold(lease: LeaseState) -> None:
    """The hold ``hold_again`` took, given up before its caller had it."""
    lease._holds -= 1


def metered(lease: LeaseState, labels: Labels, since: float) -> None:
    """Record the end of its hold in ``labels``; it started at ``since``."""
    lease._labels, lease._since = labels, since


def held_out(lease: LeaseState) -> str:
    """Why it is lost once its hold's end has come and its validity run out."""
    return lease._held_out


def labels_of(lease: LeaseState) -> Labels | None:
    return lease._labels


def watched(lease: LeaseState, unwatch: Callable[[], None]) -> None:
    """A renewer watches it: ``unwatch`` is called once it is released or lost."""
    lease._unwatch = unwatch


def stop_watching(lease: LeaseState) -> None:
    lease._stop_watching()


def unhanded(lease: LeaseState) -> None:
    """A lease that never reached its caller: released here (its renewal and watch stop,
    its metrics end); the caller gives its grant back on the server."""
    lease._mark_released()


def renewed(lease: LeaseState, valid_until: float) -> None:
    lease._renewed(valid_until)


def mark_lost(lease: LeaseState, reason: str) -> bool:
    """Record the loss and tell its holder, exactly once (True that time)."""
    return lease._mark_lost(reason)


def forked(lease: LeaseState) -> None:
    """In a fork's child: the lease is the parent's."""
    lease._forked()


def release_flow(lease: LeaseState, *, hurried: bool = False) -> Any:
    """The flow that releases it (its own rule; ``hurried``: bounded, see
    ``_rules.flows.release``)."""
    return lease._release_flow(hurried=hurried)


def extend_flow(lease: LeaseState, ttl_ms: int, wait: float | None = None) -> Any:
    """The flow that extends it (its own rule: one server's, or a Redlock's quorum)."""
    return lease._extend_flow(ttl_ms, wait)


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
        if lease is not None and (lease.released or lease._generation != _fork.generation):
            self.left(holder, lease)
            return None
        return lease

    def hold(self, holder: object, lease: LeaseState) -> None:
        if holder is None:  # (nobody to hold it again: see held)
            return
        self._table[holder] = lease
        lease._held_in = (self, weakref.ref(holder))

    def left(self, holder: object, lease: LeaseState) -> None:
        if holder is not None and self._table.get(holder) is lease:
            del self._table[holder]


class Acquired:
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
        return {lease.token for lease in list(leases) if not (lease.released or lease.lost)}


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
