"""A lock's front without its I/O: each lock object's rules (``FrontCore``: its spec and
options, reentrant holds, metrics, the attempt it makes). The `with` blocks open in this
context are noted in ``_rules.lease``. The front itself (``acquire``, ``try_acquire``,
``with``) is ``_async.front`` (and its generated twin); its decorators are each
backend's ``guarded``, refusing what ``_rules.decorate`` refuses.

A ``reentrant`` lock keeps a table of the leases it handed out by holder (the thread, or
the asyncio task, that acquired): an acquire by a holder returns its lease again, one
hold more (``hold_count``), and only the release of the last hold goes to the server.

A front holds a ``FrontCore``: its lock's rules (spec, options, holds, metrics, the
attempt it makes), as an object, so that each public class is its front and nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol, TypeVar

from .._base import metrics as _metrics
from .._base.errors import LockLost
from .._base.types import OnLost
from . import arguments as args
from . import inspect as _inspect
from .flows import Acquisition, Flow, Grant, LockSpec
from .inspect import LockInfo
from .lease import HandedOut, Holders, LeaseState


class Attempt(Protocol):
    """One caller's try to take a lock (``_rules.flows.Acquisition``, ``_rules.quorum``'s twin)."""

    @property
    def outstanding(self) -> bool:
        """Whether ``abandon()`` is needed if the attempt is interrupted."""

    def settings_within(self) -> float | None:
        """How long the look at the server's settings may take first (None: its own)."""

    def run(self) -> Generator[Any, Any, Grant | None]: ...

    def abandon(self, *, hurried: bool = False) -> Generator[Any, Any, None]: ...


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
