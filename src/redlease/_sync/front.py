# Generated from _async/front.py by scripts/unasync.py: edit that file, then run
# `python scripts/unasync.py` (the tests run it with --check).
"""What a caller holds and what it takes it from: a lock's front and its lease.

The front: ``acquire``, ``try_acquire``, ``with`` and the decorator, once for every kind
(``Lock``, ``Semaphore``, a read/write lock's sides, ``Redlock``). A lock class gives it
its rules (a ``_rules.front.FrontCore``: the spec, the options, the attempt it makes,
the lease state a grant becomes) and its driver, and the lease class it hands out
(``_lease_type``); the front does the rest: checking the server once, cleaning up after
an interrupted attempt, starting renewal. What needs no I/O is in ``_rules``: the lock's
rules, reentrant holds and metrics in ``_rules.front``, the `with` blocks open in this
context in ``_rules.lease``, the decorator's refusals in ``_rules.decorate``.

The lease: its I/O (``extend``, ``release``, ``with lease:``) over the state in
``_rules.lease``, and the driver protocol its lock's flows run through.

Written once, as asyncio code; ``scripts/unasync.py`` generates the blocking twin.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Generator, Sequence
from types import FrameType, TracebackType
from typing import Any, Protocol, TypeVar, cast

from .._base import fork as _fork
from .._base import metrics as _metrics
from .._base.errors import AcquireTimeout, LockError, LockLost
from .._base.types import Seconds
from .._rules import arguments as args
from .._rules.decorate import P, R
from .._rules.flows import Grant
from .._rules.front import Attempt, FrontCore
from .._rules.inspect import LockInfo
from .._rules.lease import (
    HELD,
    RELEASED,
    LeaseState,
    Opening,
    close_entered,
    close_stale,
    entered,
    entered_lease,
    forget_entered,
    handlers_run,
    lost_at_block_end,
    opening,
    push_entered,
    refuse_nested,
    release_begun,
    stale_entered,
    tidy_entered,
)
from .._rules.multilock import MultiLeaseState
from . import renewer as _renewer
from .backend import BlockBase, Cancelled, Flag, current_holder, going_away, guarded, shielded

T = TypeVar("T")

# Guards the note of a release on its way (``Lease._sending``): leases are handed
# between threads, and released there.
_SENDING = _fork.thread_lock()
# How long a second release of a lease waits for the first one's end, in reply bounds (the
# first one is given up on by then).
_SECOND_RELEASE_WAIT = 2.0
_Lease = TypeVar("_Lease", bound="Lease")


class Driver(Protocol):
    """Runs a lock's flows on its server(s) (``IO``, or a Redlock's nodes): what a
    lease, its lock's front and the renewer need."""

    def run(self, flow: Generator[Any, Any, T], action: str) -> T: ...

    def check_server_once(self, within: float | None = None) -> None: ...

    def execute_many(self, steps: Sequence[Any]) -> list[Any]:
        """The first steps of several leases' extend flows, at once (the renewer's)."""


class Lease(BlockBase):
    """A held lock. Use it as a context manager to release it when the block ends."""

    # A release of it on its way, and what a second caller's release waits on meanwhile.
    _sending = False
    _sent: Flag | None = None

    def __init__(self, state: LeaseState, io: Driver) -> None:
        self._state, self._io = state, io
        state.lease = self

    @property
    def name(self) -> str:
        """The name of the lock this lease is for."""
        return self._state.spec.name

    @property
    def token(self) -> str:
        """The random value that proves ownership on the server."""
        return self._state.token

    @property
    def fence(self) -> int:
        """Fencing token: strictly greater than any earlier grant's for this name."""
        return self._state.fence

    @property
    def valid_until(self) -> float:
        """End of validity on the lock's monotonic clock."""
        return self._state.valid_until

    def remaining(self) -> float:
        """Seconds of validity left (0.0 once expired, released or lost), by this
        process's clock, drift margin taken off. Never raises."""
        return self._state.remaining()

    @property
    def lost(self) -> bool:
        """True once the lease is known gone or its validity has run out (not after release)."""
        return self._state.lost()

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost, in words: the server said it is no longer ours
        (expired, or taken over: ``redlease release --force``, a failover), its renewals
        failed until its validity ran out, renewal stopped at ``max_hold``... None while
        it is not lost."""
        state = self._state
        return state.reason if state.lost() else None

    @property
    def released(self) -> bool:
        """True once released (``release()``, or the end of its ``with`` block)."""
        return self._state.status == RELEASED

    @property
    def hold_count(self) -> int:
        """How many acquisitions this lease stands for and that are not released yet: 1,
        or more when a ``reentrant`` lock was acquired again by the thread that holds
        it. Only the release of the last one releases on the server."""
        return self._state.hold_count()

    def check(self) -> None:
        """Raise LockLost unless the lease is still held and valid: call it before each
        step of protected work (and pass ``fence`` to the resource when it can check it)."""
        self._state.check()

    def extend(self, ttl: float | None = None) -> None:
        """Make the lease last ``ttl`` seconds from now (default: the lock's ttl).

        Raises LockLost if it is no longer ours (a Redlock's: if a majority says so; if
        too few nodes answer to tell, QuorumError, and the lease keeps its validity).
        """
        state = self._state
        ttl_ms = state.extend_ttl_ms(ttl)
        state.check()
        with state.lost_on_lock_lost():
            until = self._io.run(state.extend_flow(ttl_ms), "extend")
        state.renewed(until)

    def release(self) -> None:
        """Give the lock back (and hand it to the next waiter). Releasing twice is a no-op.

        A lease of a ``reentrant`` lock acquired n times is released on the server by
        the n-th release; the ones before only count down ``hold_count``.

        Raises LockLost if the lock had expired or been taken over before the release. A
        Redlock's: QuorumError if too few nodes answered (the lease counts as released:
        what is left expires with the ttl).
        """
        state = self._state
        state.release_calls += 1  # (first: see _rules.lease.release_calls)
        if state.status == RELEASED:
            return
        if state.holds > 1:  # a reentrant lease's inner hold: one hold fewer, no I/O
            try:
                state.check()  # a lease lost meanwhile says so at each release
            finally:
                state.holds -= 1
            return
        if self._sending:  # another caller's release of it is on its way
            self._second_release(state)
            return
        try:
            self._sending = True
            state.not_forked()
            with state.releasing():
                self._io.run(state.release_flow(), "release")
        except LockError:
            raise
        except BaseException:
            # Interrupted (an error raised by a signal handler: a Ctrl-C the program
            # goes on after) before, while or after the release was sent: finished in
            # haste, then the interruption goes on.
            self._finish_in_haste()
            raise
        finally:
            with _SENDING:
                self._sending, sent, self._sent = False, self._sent, None
            if sent is not None:
                sent.set()

    def _second_release(self, state: LeaseState) -> None:
        """A release of a lease whose release another caller (a thread, a task it was
        handed to) has on its way: the no-op a second release is, once the first has
        ended. Not sent again: the server keeps one release mark per lock, and a
        second script run after the next holder's release would find the name gone."""
        with _SENDING:
            if not self._sending:
                return
            sent = self._sent
            if sent is None:
                sent = self._sent = Flag()
        sent.wait(state.spec.reply_timeout * _SECOND_RELEASE_WAIT)

    def _finish_in_haste(self) -> None:
        """The release of a lease whose holder was interrupted as it let go: its
        renewal stopped first, then its release sent again (a second run is harmless)
        within half a second and without retry (``_rules.flows.release``'s
        ``hurried``): what a server that does not answer keeps expires with the ttl. A
        reentrant lease held more than once gives up one hold. Nothing if it is released
        or lost already, or a fork's parent's. One more interruption while the release
        is on its way sends it once more; a third may cut it short."""
        state = self._state
        if state.status != HELD or state.generation != _fork.generation:
            return
        if state.holds > 1:
            state.holds -= 1
            return
        try:
            state.mark_released()  # (renewal stops, whatever comes of the release)
            self._send_in_haste()
        except BaseException:
            state.mark_released()
            self._send_in_haste()
            raise

    def _send_in_haste(self) -> None:
        with contextlib.suppress(Exception):
            self._io.run(self._state.release_flow(hurried=True), "release")

    def __enter__(self: _Lease) -> _Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockLost as lost:
            lost_at_block_end(self._state, lost, exc)

    def __repr__(self) -> str:
        return self._state.described(type(self).__name__)


# ------------------------------------------------------------- a lease, for its kin
# What the front below, the multi-lock and the election do to a lease beyond its public
# surface: module functions, so that the lease's public class shows none of them, and
# nothing outside this module reads its private state.


def give_back_in_haste(lease: Lease) -> None:
    """Give back a one-server lease as the process goes away: its renewal stopped, its
    release bounded to half a second with no retry (``_rules.flows.release``'s
    ``hurried``); BackendError if that fails, and what the server keeps then expires
    with the ttl."""
    state = lease._state
    state.stop_watching()
    lease._io.run(state.release_flow(hurried=True), f"give back {lease.name!r}")


def finish_in_haste(held: object) -> None:
    """A lease's release, or each of a multi-lease's, finished in haste (see
    ``Lease._finish_in_haste``); anything else holds nothing. ``held``: a lease,
    its state, or a multi-lease's state."""
    if isinstance(held, LeaseState):
        held = held.lease
    if isinstance(held, Lease):
        held._finish_in_haste()
    elif isinstance(held, MultiLeaseState):
        leases = list(held.leases.values())
        for lease in leases:  # every renewal stops first, whatever cuts the rest short
            lease._state.stop_watching()
        for lease in leases:
            finish_in_haste(lease)


def unhanded(lease: Lease) -> None:
    """A lease that never reached its caller: released here (see ``mark_released``)."""
    lease._state.mark_released()


# --------------------------------------------------------------------------- the front


def end_block(
    block: object,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> None:
    """The end of a `with` block of ``block`` (a lock, a multi-lock, a job; their
    ``__exit__`` itself, so that no call comes before its ``try``): its lease is
    released, whatever interrupts the end (an error raised by a signal handler, at any
    step): a release that had not begun by then is made in haste (a lease's own release
    finishes one that had), and the block's note is dropped."""
    entry = None
    try:
        entry = close_entered(block)
        held = _released_by_block(entered_lease(entry))
        if held is not None:
            held.__exit__(exc_type, exc, tb)
    except BaseException as failure:
        if not isinstance(failure, LockError):
            if entry is None:  # interrupted before its note was found
                entry = close_entered(block, missing_ok=True)
            if entry is not None and not release_begun(entry):
                finish_in_haste(entered_lease(entry))
        raise
    finally:
        tidy_entered()


def opened(frame: FrameType | None) -> Opening:
    """A `with` block opened by the current holder from ``frame`` (the caller of
    ``__enter__``); what the holder's blocks found over hold (``stale_entered``) is
    given back first, in haste."""
    at = opening(current_holder(), frame)
    for stale in stale_entered(at):
        finish_in_haste(entered_lease(stale))
        close_stale(stale)
    return at


def caller() -> FrameType | None:
    """The frame that called the caller (``__enter__``'s: the `with` statement's)."""
    frame = inspect.currentframe()
    return None if frame is None or frame.f_back is None else frame.f_back.f_back


def _released_by_block(noted: object) -> Any:
    """What a block's end releases of what it noted: a lease or a multi-lease (each noted
    as its state); None for a job's Skipped, which holds nothing."""
    if isinstance(noted, (LeaseState, MultiLeaseState)):
        return noted.lease
    return None


class Front(BlockBase):
    """``acquire``, ``try_acquire``, ``with`` and ``@lock``, once for every kind of lock:
    over the lock's rules (``_core``, see ``_rules.front.FrontCore``) and the driver that
    runs its flows (``_io``)."""

    # The class of the leases it hands out (each holds the state its core makes).
    _lease_type: type[Lease] = Lease

    def __init__(self, core: FrontCore, io: Driver) -> None:
        self._core, self._io = core, io

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._core.spec.name

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._core.spec.ttl

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl}s>"

    def _look(self) -> LockInfo:
        """What the server says of the name now (``locked``, ``owned``, ``waiting``)."""
        return self._io.run(self._core.look(), f"inspect {self.name!r}")

    def _owned(self) -> bool:
        tokens = self._core.acquirers().tokens(current_holder())
        if not tokens:
            return False
        info = self._look()
        return any(holder.token in tokens for holder in info.holders)

    def acquire(self, timeout: Seconds | None = None) -> Lease:
        """Wait until the lock is ours and return the lease.

        ``timeout`` bounds the wait in seconds (None: no bound; 0: a single try). Raises
        AcquireTimeout if the lock stayed busy (a Redlock: QuorumError if too few nodes
        answered); BackendError if the server failed until the timeout; InvalidArgument
        for a bad ``timeout``; LockLost if a ``reentrant`` holder's lease was lost
        meanwhile. An acquire of a one-server lock interrupted as the process goes away
        (KeyboardInterrupt, SystemExit) gives back what it may have taken within half a
        second (a Redlock's: within its node timeout); what a server that does not
        answer keeps by then expires on its own.
        """
        return cast(Lease, (self._waited(timeout)).lease)

    def _waited(self, timeout: Seconds | None) -> LeaseState:
        state = self._acquire(args.timeout(timeout), wait=True)
        if state is None:
            raise AcquireTimeout(f"{self._core.noun} {self.name!r} still busy after {timeout}s")
        return state

    def try_acquire(self) -> Lease | None:
        """Take the lock if it is free right now; never waits. None if it is busy.

        Raises BackendError if the server fails (a Redlock: QuorumError if too few nodes
        answered), and LockLost if a ``reentrant`` holder's lease was lost meanwhile.
        Against a server that is down or does not answer it raises within 2 seconds,
        whatever the ttl and the client's retry policy (a connection failure is tried
        again once, at once); with ``replicas=``, add the wait for them. A Cluster
        client's calls keep its own timeouts and retries.
        """
        state = self._acquire(0.0, wait=False)
        return None if state is None else cast(Lease, state.lease)

    def _acquire(
        self, timeout: float | None, *, wait: bool, entering: Opening | None = None
    ) -> LeaseState | None:
        """The lease's state, or None (a try, or a timeout). ``entering``: the `with`
        block it opens (noted before it is returned, see ``_granted``)."""
        core = self._core
        if core.holding is None:
            lease = self._take(timeout, wait=wait, entering=entering)
            if lease is None:  # (a lease goes back with no call between: see _granted)
                core.refused(current_holder, wait=wait)
            return lease
        holder = current_holder() if entering is None else entering.holder
        held = core.held_by(holder)
        if held is not None:
            if entering is not None:
                entry = None
                try:
                    entry = entered(self, held, entering)
                    push_entered(entry)
                except BaseException:
                    if entry is not None:
                        forget_entered(entry)
                    held.drop_hold()  # (the hold held_by took: the block never began)
                    raise
            return held
        lease = self._take(timeout, wait=wait, holder=holder, entering=entering)
        if lease is None:
            core.refused(current_holder, wait=wait)
        return lease

    def _take(
        self,
        timeout: float | None,
        *,
        wait: bool,
        holder: object = None,
        entering: Opening | None = None,
    ) -> LeaseState | None:
        started = _metrics.now()
        # (its deadline counts the look)
        attempt = self._core.new_attempt(timeout, wait=wait, holder=current_holder)
        lease = self._granted(attempt, started, holder=holder, entering=entering)
        if lease is None:
            self._core.not_granted(started, wait=wait)
        return lease

    def _granted(
        self,
        attempt: Attempt,
        started: float,
        *,
        holder: object = None,
        entering: Opening | None = None,
        block: object = None,
    ) -> LeaseState | None:
        """Run ``attempt`` (after the one look at the server) and hand its grant over as
        a lease (``_watched``: its state), noted for its reentrant ``holder`` and, ``entering``, as
        the `with` block of ``block`` (default: this lock) that it opens; None if nothing
        was granted. One try covers every step from the first write to the return, so
        an interruption anywhere (a cancellation, an error raised by a signal handler)
        gives back what the attempt may have taken: no one else could release it."""
        lease: LeaseState | None = None
        entry = None
        try:
            self._io.check_server_once(attempt.settings_within())
            grant = self._io.run(attempt.run(), f"acquire {self.name!r}")
            if grant is None:
                return None
            lease = self._watched(grant, started)
            if holder is not None:
                self._core.hold(holder, lease)
            if entering is not None:
                entry = entered(self if block is None else block, lease, entering)
                push_entered(entry)
            return lease
        except BaseException as exc:
            if entry is not None:
                forget_entered(entry)
            if lease is not None:
                lease.mark_released()  # (it never reached its caller)
            if attempt.outstanding:
                self._abandon(attempt, hurried=going_away(exc))
            raise

    def _watched(self, grant: Grant, started: float) -> LeaseState:
        """The state of ``grant``'s lease (made, held by its lease, noted for
        ``owned()``, metered, watched or renewed as the lock's options say)."""
        core = self._core
        state = core.new_state(grant)
        try:
            self._lease_type(state, self._io)  # (the lease holds it: state.lease)
            core.acquirers().note(current_holder(), state)
            core.opened(state, started)
            if core.auto_renew:
                _renewer.watch(state, self._io, core.max_hold)
            elif core.watches:
                _renewer.watch(state, self._io, 0.0)  # watch its validity, never renew
        except BaseException:
            state.mark_released()
            raise
        return state

    def _abandon(self, attempt: Attempt, *, hurried: bool = False) -> None:
        # The original error matters more (an orphaned key expires with its ttl); asyncio:
        # cancelled again while cleaning up, the clean-up itself ran to its end.
        with contextlib.suppress(Exception, Cancelled):
            shielded(
                lambda haste: self._io.run(
                    attempt.abandon(hurried=haste), f"clean up {self.name!r}"
                ),
                hurried,
            )

    def __enter__(self) -> Lease:
        at = opened(caller())
        core = self._core
        if core.refuses_nesting and core.holding is None:
            refuse_nested(self, core.noun, core.name, at.holder)
        state = self._acquire(None, wait=True, entering=at)
        assert state is not None  # (no timeout: a lease, or an error)
        lease: Lease = state.lease  # (no cast(): no call before the try)
        try:  # the block is noted and its lease renewed, and the `with` statement
            # calls no __exit__ if this raises: pending signal handlers run here (a
            # function's start), where their error still ends the block
            handlers_run()
        except BaseException as failure:
            end_block(self, type(failure), failure, failure.__traceback__)
            raise
        return lease

    __exit__ = end_block

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """``@lock``: each call of ``fn`` runs holding the lock, as in a block of the
        lock, and raises what that raises. A function whose work would run after the
        lock is given back (a generator function; for a blocking lock, a coroutine
        function) is refused (InvalidArgument)."""
        return guarded(self, fn)


# ------------------------------------------------------------- a front, for its kin
# What the multi-lock does through a front beyond its public surface (as for the lease
# above).


def handed_out(front: Front, grant: Grant, started: float) -> Lease:
    """The lease of a grant that ``front``'s lock got in another way (a multi-lock's one
    script): watched, renewed and metered as its own acquire's would be."""
    return cast(Lease, front._watched(grant, started).lease)
