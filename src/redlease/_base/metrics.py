"""Metrics through OpenTelemetry, when its API is installed (the ``otel`` extra).

Nothing here imports OpenTelemetry until a lock first records something, and nothing is
recorded without it: ``instruments()`` is then None for good and each hook costs one
call. With the API installed, the meter is the global provider's (``metrics.get_meter``,
whose proxy follows a provider set later) unless ``metrics.configure`` names another;
without an SDK its instruments are OpenTelemetry's no-op ones.

Where each event is recorded, once for both twins:

* an acquire that returned (a lease, or None): ``_rules.front`` (``FrontCore.opened`` and
  ``FrontCore.not_granted``), wait duration, acquisitions and timeouts;
* the end of a hold (released, or found lost by anyone): ``LeaseState.mark_released``
  and ``mark_lost`` in ``_rules.lease``, hold duration and lost leases;
* a renewal that did not extend its lease: ``Schedule.settle`` in ``_rules.renewal``.

Attribute sets are made once per kind (per lock object when names are recorded) and
configuration (``Labels``), and every acquire and release reuses them: a dict built per
call would be garbage on the hot path. What recording costs is mostly the SDK's own
work per synchronous record (several microseconds: it cleans and hashes the attributes,
finds the series, aggregates under a lock), hence the observable acquisitions counter
(see ``Instruments``), and the two histograms recorded only when asked for
(``configure(durations=True)``), then handed to the SDK later, off the caller's path
(``Deferred``). Their records cost the SDK more CPU than a fast cycle can spare (see
``configure``), and deferring moves that work, it does not remove it.
"""

from __future__ import annotations

import atexit
import copy
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import fork as _fork
from . import threads as _threads
from .errors import InvalidArgument
from .version import __version__

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider

METER = "redlease"

# Attribute keys. The name is recorded only when asked for (configure): lock
# names are the application's and may be unbounded (a lock per order, per user), and
# every distinct attribute set is a time series a backend keeps.
KIND = "redlease.kind"  # lock, redlock, semaphore, rwlock, multilock, election, once
MODE = "redlease.mode"  # a read/write lock's side: read or write
NAME = "redlease.name"
OUTCOME = "redlease.outcome"  # wait: acquired, timeout, busy; hold: released, lost
REASON = "redlease.reason"  # a skipped scheduled call's: running, ran this period
ERROR_TYPE = "error.type"  # OpenTelemetry's own key: why a renewal failed

# Seconds, from a fast local grant to a long job's hold (the API's default boundaries
# are for milliseconds and would put every wait under a second in their first bucket).
BOUNDARIES = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
)  # fmt: skip

now = time.monotonic  # the clock of every duration recorded here

log = logging.getLogger(__name__)

# Durations waiting to be recorded (see Deferred): how many at most, how often the
# drainer wakes, and how many wake it early.
PENDING_LIMIT = 100_000
DRAIN_EVERY = 0.5  # seconds
DRAIN_AT = 10_000


class Deferred:
    """Synchronous records made later, off the caller's path: an acquire or a release
    appends ``(instrument, value, attributes, context)`` to a deque (one atomic append,
    a fraction of a microsecond), and the records reach the SDK when the queue is
    drained:

    * by a daemon thread, ``redlease-metrics``, started at the first record, which wakes
      every ``DRAIN_EVERY`` seconds (sooner once ``DRAIN_AT`` records wait);
    * at each collection, from the acquisitions counter's callback, so an export has
      what was recorded before it (with this SDK the records drained there land in the
      same collection; an SDK that reads its storage before its callbacks would have them
      in the next one: at most one export interval late);
    * by ``flush()`` (``redlease.metrics.flush``), and at interpreter exit (atexit), so a
      short-lived process (a CLI run) loses nothing.

    The queue holds ``PENDING_LIMIT`` records at most: past that (a drainer that cannot
    keep up, or a process whose drainer cannot run) a record is dropped, and the drainer
    logs how many at WARNING, once per wake-up while it goes on. A forked child starts
    with an empty queue (the parent records what it had pending: the child must not
    record it again) and a drainer of its own at its first record.

    The records are the histograms': the SDK has no asynchronous histogram, and each
    synchronous record costs it more than a lock's cycle can spare. Each keeps the
    caller's context (OpenTelemetry's, read when it is queued), so an SDK that samples
    exemplars still links a duration to the caller's trace; passing it also spares the
    SDK its own look-up. The rare counters (timeouts, lost leases, failed renewals) stay
    synchronous: they cost nothing on a lock's usual path.
    """

    def __init__(self) -> None:
        self.queue: deque[tuple[Histogram, float, dict[str, str], Context]] = deque()
        self._reset()
        if hasattr(os, "register_at_fork"):  # (POSIX)
            os.register_at_fork(
                before=self._before_fork,
                after_in_parent=self._after_fork_in_parent,
                after_in_child=self._reset,
            )

    def _reset(self) -> None:
        """A new process's state (also a forked child's: whatever the parent had pending
        is the parent's to record; the locks may have been held by its threads)."""
        self.queue.clear()
        self.dropped = 0  # since the last warning (approximate: counted without a lock)
        self._draining = threading.Lock()
        self._starting = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False  # after the exit flush: records go straight to the SDK

    def record(
        self, instrument: Histogram, value: float, attributes: dict[str, str], context: Context
    ) -> None:
        queue = self.queue
        waiting = len(queue)
        if waiting >= PENDING_LIMIT:
            self.dropped += 1
            return
        queue.append((instrument, value, attributes, context))
        if waiting == DRAIN_AT:
            self._wake.set()
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        with self._starting:
            if self._thread is not None:
                return
            if self._closed:  # at exit, after the flush: no thread to hand over to
                self.drain()
                return
            self._thread = _threads.daemon(self._run, name="redlease-metrics")
            self.drain_at_exit()

    def drain_at_exit(self) -> None:
        """(Again) the last of the atexit functions registered so far, so the first to
        run: before the shutdown of a meter provider made earlier, whose last export
        should have these records."""
        atexit.unregister(self._close)
        atexit.register(self._close)

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(DRAIN_EVERY)
            self._wake.clear()
            self.drain()

    def drain(self, wait: float = -1) -> None:
        """Hand the records waiting now to the SDK (those appended meanwhile wait for
        the next drain). ``wait``: how long to wait for a drain under way elsewhere
        (forever by default), as its records must be in before this returns."""
        if not self._draining.acquire(timeout=wait):
            return
        try:
            popleft = self.queue.popleft
            for _ in range(len(self.queue)):
                instrument, value, attributes, context = popleft()
                try:
                    instrument.record(value, attributes, context)
                except Exception:  # (an SDK's failure must not stop the drainer)
                    log.warning("an OpenTelemetry record failed", exc_info=True)
        finally:
            self._draining.release()
        dropped, self.dropped = self.dropped, 0
        if dropped:
            log.warning(
                "%d duration records dropped: more than %d waited to be recorded",
                dropped,
                PENDING_LIMIT,
            )

    def _close(self) -> None:
        self._closed = self._stopping = True
        thread = self._thread
        if thread is not None:
            self._wake.set()
            thread.join(timeout=5.0)
            self._thread = None  # (a record made later is drained at once: _start)
        self.drain()

    def _before_fork(self) -> None:
        # Not in the middle of a drain: the child must not inherit an SDK lock taken by
        # the drainer (which does not follow it into the child).
        self._draining.acquire()

    def _after_fork_in_parent(self) -> None:
        self._draining.release()

    def pending(self) -> int:
        return len(self.queue)


deferred = Deferred()


def flush() -> None:
    """Record now what is waiting to be recorded: the durations of the acquires and
    releases made so far are in the SDK when this returns (they reach it anyway, within
    a second, or at the next collection or at exit). Call it before collecting by hand
    (``InMemoryMetricReader.get_metrics_data``, ``MeterProvider.force_flush``) when an
    export must have everything up to now."""
    deferred.drain()


Cell = list[int]  # one count, changed under Counts.lock


class Counts:
    """The acquisitions counted, by attribute set: one per meter, shared by the
    ``Instruments`` of every configuration made from it (copies)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards the cells
        self.cells: dict[tuple[tuple[str, str], ...], Cell] = {}
        _fork.renew_in_child(self._after_fork)

    def _after_fork(self) -> None:
        # A thread of the parent may have been counting at the fork. (Here, not on each
        # Instruments: its copies must go on sharing one lock.)
        self.lock = threading.Lock()


class Instruments:
    """The seven instruments of one meter, whether lock names go into attributes, and
    whether durations are recorded."""

    def __init__(self, meter: Meter, observation: Any, context: Callable[[], Context]) -> None:
        self.record_names, self.durations = False, False  # (set per configuration)
        self.context = context  # the caller's, kept with a duration (see Deferred)
        # Acquisitions are counted here and observed at each collection (an observable
        # counter): a synchronous add costs the SDK as much as a histogram record, several
        # microseconds, once per acquire. The rarer events stay synchronous, so that an
        # SDK with exemplars links a lost lease to the trace that held it.
        self.counts = Counts()
        self._observation = observation
        self.made: dict[tuple[str, str | None], Labels] = {}  # (set per configuration)
        self.wait: Histogram = meter.create_histogram(
            "redlease.lock.wait.duration",
            unit="s",
            description="How long an acquire waited, whatever its outcome",
            explicit_bucket_boundaries_advisory=BOUNDARIES,
        )
        self.hold: Histogram = meter.create_histogram(
            "redlease.lock.hold.duration",
            unit="s",
            description="How long a lease was held: from its grant to its release or loss",
            explicit_bucket_boundaries_advisory=BOUNDARIES,
        )
        meter.create_observable_counter(
            "redlease.lock.acquisitions",
            callbacks=[self._observe_acquisitions],
            unit="{acquisition}",
            description="Leases handed out",
        )
        self.timeouts: Counter = meter.create_counter(
            "redlease.lock.timeouts",
            unit="{timeout}",
            description="Acquires that gave up waiting (AcquireTimeout)",
        )
        self.lost: Counter = meter.create_counter(
            "redlease.lease.lost",
            unit="{lease}",
            description="Leases found lost: taken over, expired, not renewed in time",
        )
        self.skips: Counter = meter.create_counter(
            "redlease.once.skips",
            unit="{skip}",
            description="Scheduled calls skipped (redlease.once): the name was held, or "
            "the period's run had been made (redlease.reason says which)",
        )
        self.renewal_failures: Counter = meter.create_counter(
            "redlease.renewal.failures",
            unit="{renewal}",
            description="Renewals that did not extend their lease (error.type says why)",
        )

    def labels(self, kind: str, mode: str | None, name: str) -> Labels:
        """A primitive's attribute sets: one per kind and mode, shared by every lock
        object of it (a lock made per call makes none); one per object with names."""
        if self.record_names:
            return Labels(self, kind, mode, name)
        made = self.made.get((kind, mode))
        if made is None:
            made = self.made.setdefault((kind, mode), Labels(self, kind, mode, name))
        return made

    def acquisitions_cell(self, attributes: dict[str, str]) -> Cell:
        """The count of acquisitions with these attributes (one per attribute set, shared
        by every primitive that has them: a lock object made per call still adds up)."""
        key = tuple(sorted(attributes.items()))
        counts = self.counts
        with counts.lock:
            return counts.cells.setdefault(key, [0])

    def _observe_acquisitions(self, options: Any) -> list[Any]:
        # Each collection drains the durations waiting, so an export has them (see
        # Deferred). Waiting for a drain under way is bounded: a collection is no place
        # to wait long, and what it leaves is in the next one.
        deferred.drain(wait=1.0)
        with self.counts.lock:
            counts = [(dict(key), cell[0]) for key, cell in self.counts.cells.items()]
        return [self._observation(count, attributes) for attributes, count in counts]


class Labels:
    """One primitive's attribute sets under one ``Instruments``, made once."""

    __slots__ = (
        "acquired",
        "acquisitions",
        "base",
        "busy",
        "of",
        "released",
        "timed_out",
        "was_lost",
    )

    def __init__(self, of: Instruments, kind: str, mode: str | None, name: str) -> None:
        self.of = of
        base = {KIND: kind}
        if mode is not None:
            base[MODE] = mode
        if of.record_names:
            base[NAME] = name
        self.base = base
        self.acquired = {**base, OUTCOME: "acquired"}
        self.timed_out = {**base, OUTCOME: "timeout"}
        self.busy = {**base, OUTCOME: "busy"}
        self.released = {**base, OUTCOME: "released"}
        self.was_lost = {**base, OUTCOME: "lost"}
        self.acquisitions = of.acquisitions_cell(base)

    def granted(self, started: float) -> float:
        """An acquire returned a lease; when it did (the hold starts there)."""
        at = now()
        of = self.of
        with of.counts.lock:
            self.acquisitions[0] += 1
        if of.durations:
            deferred.record(of.wait, at - started, self.acquired, of.context())
        return at

    def not_granted(self, started: float, *, waited: bool) -> None:
        """An acquire returned without a lease: ``acquire`` gave up (a timeout), or
        ``try_acquire`` found it busy."""
        of = self.of
        if waited:
            of.timeouts.add(1, self.base)
        if of.durations:
            value, attributes = now() - started, self.timed_out if waited else self.busy
            deferred.record(of.wait, value, attributes, of.context())

    def ended(self, since: float, *, lost: bool) -> None:
        """A hold that started at ``since`` ended: released, or found lost."""
        of = self.of
        if lost:
            of.lost.add(1, self.base)
        if of.durations:
            value, attributes = now() - since, self.was_lost if lost else self.released
            deferred.record(of.hold, value, attributes, of.context())

    def skipped(self, reason: str) -> None:
        """A scheduled call was skipped, for ``reason``."""
        self.of.skips.add(1, {**self.base, REASON: reason})

    def renewal_failed(self, error: BaseException) -> None:
        self.of.renewal_failures.add(1, {**self.base, ERROR_TYPE: type(error).__qualname__})


# The configuration (enabled, provider, record_names, durations), and the instruments
# made from it (looked up at first use).
_settings: tuple[bool, Any, bool, bool] = (True, None, False, False)
_current: Instruments | None = None
_ready = False
# The instruments made from each provider (None: the global one's): configured again with
# a provider, redlease takes its instruments up again, as a provider warns of an
# instrument made twice.
_global_made: Instruments | None = None
_made_from: weakref.WeakKeyDictionary[Any, Instruments] = weakref.WeakKeyDictionary()
_setting = threading.Lock()


def _new_setting_lock() -> None:
    # Another thread of the parent may have been configuring at the fork.
    global _setting
    _setting = threading.Lock()


_fork.in_child(_new_setting_lock)


def instruments() -> Instruments | None:
    """The instruments to record with, or None: OpenTelemetry is not installed, or
    metrics are switched off."""
    if _ready:
        return _current
    return _look_up()


def enabled() -> bool:
    """Whether redlease records metrics in this process."""
    return instruments() is not None


def _look_up() -> Instruments | None:
    global _current, _ready
    with _setting:
        if not _ready:
            _current = _made(*_settings)
            _ready = True
        return _current


def _made(on: bool, provider: Any, record_names: bool, durations: bool) -> Instruments | None:
    """The instruments for a configuration: the provider's (made at its first use, then
    reused), with this configuration's choices."""
    made = _instruments(provider) if on else None
    if made is None:
        return None
    made = copy.copy(made)  # (sharing the instruments and the counts)
    made.record_names, made.durations, made.made = record_names, durations, {}
    return made


def _instruments(provider: Any) -> Instruments | None:
    global _global_made
    try:
        from opentelemetry import metrics
        from opentelemetry.context import get_current
    except ImportError:  # no `otel` extra: nothing is recorded, at no cost
        return None
    earlier = _global_made if provider is None else _made_from.get(provider)
    if earlier is not None:
        return earlier
    meter = (
        metrics.get_meter(METER, __version__)
        if provider is None
        else provider.get_meter(METER, __version__)
    )
    made = Instruments(meter, metrics.Observation, get_current)
    if provider is None:
        _global_made = made
    else:
        _made_from[provider] = made
    return made


def configure(
    *,
    enabled: bool = True,
    meter_provider: MeterProvider | None = None,
    record_names: bool = False,
    durations: bool = False,
) -> None:
    """Say how redlease records its OpenTelemetry metrics (it needs the ``otel`` extra,
    ``opentelemetry-api``; without it nothing is recorded, whatever is configured here).

    ``meter_provider``: the provider to take redlease's meter from (default: the
    global one, ``opentelemetry.metrics.set_meter_provider``). ``record_names=True``
    adds each lock's name as the attribute ``redlease.name``: off by default, as lock
    names may be unbounded (one per order, per user) and each name is then a series of
    its own. ``durations=True`` adds the two histograms, the wait and hold durations:
    off by default, as each costs the SDK a record per acquire or release (10 to 20 µs
    of CPU in the Python SDK, against a loopback acquire+release of about 230 µs: a
    tight loop of cycles runs 10 to 20% slower), where the counters cost next to
    nothing (docs/design.md, "Metrics and logs", has the figures). ``enabled=False``
    records nothing.

    Each call replaces the whole configuration (an argument left out goes back to its
    default); primitives made before it follow it from their next acquire, and a lease
    held meanwhile ends on the instruments it started on.
    """
    flags = ((enabled, "enabled"), (record_names, "record_names"), (durations, "durations"))
    for flag, what in flags:
        if not isinstance(flag, bool):
            raise InvalidArgument(f"{what} must be True or False, not {flag!r}")
    if meter_provider is not None and not callable(getattr(meter_provider, "get_meter", None)):
        raise InvalidArgument(
            "meter_provider must be an OpenTelemetry MeterProvider (with get_meter), "
            f"not {type(meter_provider).__name__}"
        )
    global _settings, _current, _ready
    with _setting:
        _settings = (enabled, meter_provider, record_names, durations)
        _current, _ready = None, False  # looked up again at the next record
    if meter_provider is not None:
        # A provider made after the drainer started would shut down at exit before
        # redlease's exit flush: that flush moves behind it (before it, in running order).
        deferred.drain_at_exit()
