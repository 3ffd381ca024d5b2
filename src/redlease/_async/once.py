"""``AsyncOnce``: a scheduled job that runs once across a fleet, whichever node fires it
first, on the server's clock (the rules: ``_rules.once``). Written once, as asyncio code;
``scripts/unasync.py`` generates the blocking twin (``Once``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from .._base import metrics as _metrics
from .._base.types import OnLost, Seconds
from .._clients.checks import check_client
from .._rules import arguments as args
from .._rules.decorate import P, R, refuse_undecorable
from .._rules.flows import LockSpec
from .._rules.lease import Opening, entered, handlers_run, push_entered
from .._rules.once import (
    JobCall,
    OnceAttempt,
    OnceCore,
    OnceRule,
    RunState,
    Skipped,
    skip_message,
)
from .backend import ASYNC, BlockBase
from .front import AsyncFront, AsyncLease, caller, end_block, opened
from .io import served

log = logging.getLogger(__name__)


class AsyncRun(AsyncLease):
    """A scheduled job's run: the lease it holds (``fence``, ``check()``, ``lost``...).
    Its release (the end of the job's block) keeps the name held until ``at_least`` has
    passed since the run started, by the server's clock."""

    _state: RunState

    async def abandon(self) -> None:
        """Give the run back before its job has begun: the name is freed at once (no
        ``at_least``) and, with ``every``, the period too, so another call may run it.
        A no-op once released or lost."""
        state = self._state
        if not state.is_held():
            return
        state.not_forked()
        with state.releasing():
            await self._io.run(state.abandon_flow(), "abandon")


class _AsyncJobLock(AsyncFront):
    """The lock of a job's name, taken by the job's one try (``begin``)."""

    _core: OnceCore
    _lease_type = AsyncRun

    async def locked(self) -> bool:
        return (await self._look()).held

    async def begin(self, block: object = None, at: Opening | None = None) -> AsyncRun | Skipped:
        """The try; ``block``: the job whose `with` block the run opens, ``at`` (noted
        before it is returned, as a lock's block notes its lease)."""
        started = _metrics.now()
        attempt = OnceAttempt(self._core.spec, self._core.rule)
        state = await self._granted(attempt, started, entering=at, block=block)
        if state is not None:
            run: AsyncRun = state.lease  # (no call before the caller's try: see __aenter__)
            return run
        skipped = attempt.skipped
        assert skipped is not None
        self._core.not_granted(started, wait=False)
        labels = self._core.metered()
        if labels is not None:
            labels.skipped(skipped.reason)
        if log.isEnabledFor(logging.INFO):  # (the line is made only if it is written)
            log.info(skip_message(skipped))
        return skipped


class AsyncOnce(BlockBase):
    """A job that runs once across every process that calls it, whichever calls first:
    a call made while another run holds the job's name is skipped at once, never queued.

    ``at_most``: the longest a run holds the name (a node that dies mid-run frees it
    then). ``at_least``: the shortest; a run that ends sooner leaves the name held until
    ``at_least`` after its start, by the server's clock, so that a node whose scheduler
    fires a little later skips it (even if the first process has exited). ``every``: at
    most one run per period of the server's clock (period k covers [k * every,
    (k + 1) * every) of its time since the epoch), however far apart the nodes' clocks
    are. ``ttl``: a lease that long, renewed while the job runs, never past ``at_most``
    (default: one lease of ``at_most``). ``fence_as``: the keyword argument through which
    the decorated job gets its run's fence. ``on_lost(run)``: called once the run's lease
    is lost while the job runs (its at_most has passed: the renewer watches it; or a
    renewal found it gone), from the renewer's thread (asyncio: in the loop). Every key
    starts with ``prefix``.

    As a context manager, ``async with job as run:`` gives the run (an ``AsyncRun``, the
    lease) or a ``Skipped``, which is false: ``if not run: return``. As a decorator of an
    ``async def`` function, each call runs it in such a block and returns its result, or
    the ``Skipped``. A skip is logged (INFO) and counted (``redlease.once.skips``).

    Raises InvalidArgument, naming the argument, for one out of its range (``at_least``
    greater than ``at_most``, ``ttl`` greater than ``at_most``).
    """

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        at_most: Seconds,
        at_least: Seconds = 0,
        every: Seconds | None = None,
        ttl: Seconds | None = None,
        fence_as: str | None = None,
        on_lost: OnLost | None = None,
        prefix: str = "redlease:",
    ) -> None:
        check_client(client, want_async=ASYNC, sync_twin="Once")
        rule = OnceRule.create(at_most, at_least, every, ttl, fence_as)
        spec = LockSpec.create(name, rule.lease_ms / 1000.0, prefix=prefix)
        on_lost = args.callback(on_lost, "on_lost")  # type: ignore[assignment]
        self._rule = rule
        self._lock = _AsyncJobLock(OnceCore(spec, rule, on_lost), served(client, spec))

    @property
    def name(self) -> str:
        """The job's name (its lock's)."""
        return self._lock.name

    async def begin(self) -> AsyncRun | Skipped:
        """One try: the run, if the name was free (and, with ``every``, this period's
        run not made yet), which the caller releases (``async with run:``, or
        ``release()``); else a ``Skipped``. Never waits: one round trip. Raises
        BackendError if the server fails, within 2 seconds."""
        return await self._lock.begin()

    async def locked(self) -> bool:
        """Whether the name is held now (a run, or its at_least), as the server says."""
        return await self._lock.locked()

    async def __aenter__(self) -> AsyncRun | Skipped:
        at = await opened(caller())
        run = await self._lock.begin(block=self, at=at)
        skipped = False
        try:  # a run is noted for this block, and renewed: as a lock's (AsyncFront's)
            skipped = isinstance(run, Skipped)
            handlers_run()
        except BaseException as failure:
            if not isinstance(run, Skipped):
                await end_block(self, type(failure), failure, failure.__traceback__)
            raise
        if skipped:
            push_entered(entered(self, run, at))
        return run

    __aexit__ = end_block

    def __call__(
        self, fn: Callable[P, Awaitable[R]]
    ) -> Callable[P, Coroutine[Any, Any, R | Skipped]]:
        """``@job``: each call of ``fn`` runs it as the job's run, or is skipped (and
        returns the ``Skipped``). With ``fence_as``, ``fn`` gets the run's fence as that
        keyword argument."""
        refuse_undecorable(self, fn, want_async=ASYNC)
        fence_as = self._rule.fence_as
        call = JobCall(fn, fence_as)

        @functools.wraps(fn)
        async def run_once(*args: P.args, **kwargs: P.kwargs) -> R | Skipped:
            call.check(args, kwargs, self.name)
            async with self as run:  # (the run noted for its block before it is returned)
                if isinstance(run, Skipped):
                    return run
                if fence_as is not None:
                    kwargs[fence_as] = run.fence
                return await fn(*args, **kwargs)

        if call.shown is not None:
            run_once.__signature__ = call.shown  # type: ignore[attr-defined]
        return run_once

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
