"""Metrics through OpenTelemetry, when its API is installed (the ``otel`` extra).

Nothing here imports OpenTelemetry until a lock first records something, and nothing is
recorded without it: ``instruments()`` is then None for good and each hook costs one
call. With the API installed, the meter is the global provider's (``metrics.get_meter``,
whose proxy follows a provider set later) unless ``metrics.configure`` names another;
without an SDK its instruments are OpenTelemetry's no-op ones.

Where each event is recorded, once for both twins:

* an acquire that returned (a lease, or None): ``_fronts`` (``_Front._opened`` and
  ``_Front._not_granted``), wait duration, acquisitions and timeouts;
* the end of a hold (released, or found lost by anyone): ``LeaseState._mark_released``
  and ``_mark_lost`` in ``_lease``, hold duration and lost leases;
* a renewal that did not extend its lease: ``Schedule.settle`` in ``_renewal``.

Each primitive makes its attribute sets once per configuration (``Labels``) and every
acquire and release reuses them: the SDK's cost per record grows with the attributes it
has to read, and a dict built per call would be garbage on the hot path.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import TYPE_CHECKING, Any

from ._errors import InvalidArgument

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider

METER = "redlease"

# Attribute keys. The name is recorded only when asked for (configure): lock
# names are the application's and may be unbounded (a lock per order, per user), and
# every distinct attribute set is a time series a backend keeps.
KIND = "redlease.kind"  # lock, redlock, semaphore, rwlock, multilock, election
MODE = "redlease.mode"  # a read/write lock's side: read or write
NAME = "redlease.name"
OUTCOME = "redlease.outcome"  # wait: acquired, timeout, busy; hold: released, lost
ERROR_TYPE = "error.type"  # OpenTelemetry's own key: why a renewal failed

# Seconds, from a fast local grant to a long job's hold (the API's default boundaries
# are for milliseconds and would put every wait under a second in their first bucket).
BOUNDARIES = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
)  # fmt: skip

now = time.monotonic  # the clock of every duration recorded here


class Instruments:
    """The six instruments of one meter, and whether lock names go into attributes."""

    def __init__(self, meter: Meter, *, record_names: bool) -> None:
        self.record_names = record_names
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
        self.acquisitions: Counter = meter.create_counter(
            "redlease.lock.acquisitions",
            unit="{acquisition}",
            description="Leases handed out (a batch's lent holds included)",
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
        self.renewal_failures: Counter = meter.create_counter(
            "redlease.renewal.failures",
            unit="{renewal}",
            description="Renewals that did not extend their lease (error.type says why)",
        )


class Labels:
    """One primitive's attribute sets under one ``Instruments``, made once."""

    __slots__ = ("acquired", "base", "busy", "of", "released", "timed_out", "was_lost")

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

    def granted(self, started: float) -> float:
        """An acquire returned a lease; when it did (the hold starts there)."""
        at = now()
        of = self.of
        of.wait.record(at - started, self.acquired)
        of.acquisitions.add(1, self.base)
        return at

    def not_granted(self, started: float, *, waited: bool) -> None:
        """An acquire returned without a lease: ``acquire`` gave up (a timeout), or
        ``try_acquire`` found it busy."""
        of = self.of
        if waited:
            of.wait.record(now() - started, self.timed_out)
            of.timeouts.add(1, self.base)
        else:
            of.wait.record(now() - started, self.busy)

    def ended(self, since: float, *, lost: bool) -> None:
        """A hold that started at ``since`` ended: released, or found lost."""
        of = self.of
        if lost:
            of.hold.record(now() - since, self.was_lost)
            of.lost.add(1, self.base)
        else:
            of.hold.record(now() - since, self.released)

    def renewal_failed(self, error: BaseException) -> None:
        self.of.renewal_failures.add(1, {**self.base, ERROR_TYPE: type(error).__qualname__})


# The configuration, and the instruments made from it (looked up at first use).
_settings: tuple[bool, Any, bool] = (True, None, False)  # enabled, provider, names
_current: Instruments | None = None
_ready = False
# The provider instruments were last made from, and them: configured again with the same
# provider, redlease takes them up again (a provider warns of an instrument made twice).
_made_from: tuple[Any, Instruments] | None = None
_setting = threading.Lock()


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


def _made(on: bool, provider: Any, record_names: bool) -> Instruments | None:
    global _made_from
    if not on:
        return None
    try:
        from opentelemetry import metrics
    except ImportError:  # no `otel` extra: nothing is recorded, at no cost
        return None
    from . import __version__

    if _made_from is not None and _made_from[0] is provider:
        made = copy.copy(_made_from[1])
        made.record_names = record_names
        return made
    meter = (
        metrics.get_meter(METER, __version__)
        if provider is None
        else provider.get_meter(METER, __version__)
    )
    made = Instruments(meter, record_names=record_names)
    _made_from = (provider, made)
    return made


def configure(
    *,
    enabled: bool = True,
    meter_provider: MeterProvider | None = None,
    record_names: bool = False,
) -> None:
    """Say how redlease records its OpenTelemetry metrics (it needs the ``otel`` extra,
    ``opentelemetry-api``; without it nothing is recorded, whatever is configured here).

    ``meter_provider``: the provider to take redlease's meter from (default: the
    global one, ``opentelemetry.metrics.set_meter_provider``). ``record_names=True``
    adds each lock's name as the attribute ``redlease.name``: off by default, as lock
    names may be unbounded (one per order, per user) and each name is then a series of
    its own. ``enabled=False`` records nothing. Each call replaces the whole
    configuration (an argument left out goes back to its default); primitives made
    before it follow it from their next acquire.
    """
    for flag, what in ((enabled, "enabled"), (record_names, "record_names")):
        if not isinstance(flag, bool):
            raise InvalidArgument(f"{what} must be True or False, not {flag!r}")
    if meter_provider is not None and not callable(getattr(meter_provider, "get_meter", None)):
        raise InvalidArgument(
            "meter_provider must be an OpenTelemetry MeterProvider (with get_meter), "
            f"not {type(meter_provider).__name__}"
        )
    global _settings, _current, _ready
    with _setting:
        _settings = (enabled, meter_provider, record_names)
        _current, _ready = None, False  # looked up again at the next record
