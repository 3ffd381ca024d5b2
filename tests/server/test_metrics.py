"""Metrics through OpenTelemetry, read back with the SDK's in-memory reader against real
servers: acquisitions, waits and holds of both twins, a timeout, a lost lease (and its
failed renewal), names only when asked for, each primitive's kind;
then a process without OpenTelemetry, where locks work and nothing is recorded.

Durations reach the SDK later than they happen (``_base.metrics.Deferred``): the helpers below
flush them first, and the tests of the queue itself (a collection drains it, the
drainer thread does without one, a forked child, the exit) read without flushing.

Durations are only checked from below (a hold slept through lasts at least that long):
a slow machine makes them longer, never shorter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import redlease
from redlease._base import metrics as _metrics
from redlease.tools import servers
from waiting_helpers import lock_key, wait_until

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

# The attributes the helpers below filter on, by keyword.
KEYS = {
    "kind": "redlease.kind",
    "mode": "redlease.mode",
    "name": "redlease.name",
    "outcome": "redlease.outcome",
    "error_type": "error.type",
    "reason": "redlease.reason",
}


class Read:
    """What redlease recorded so far through one in-memory reader (of ``provider``)."""

    def __init__(self, reader: InMemoryMetricReader, provider: MeterProvider) -> None:
        self.reader, self.provider = reader, provider

    def points(self, metric: str, *, flush: bool = True) -> list[Any]:
        """The points of ``metric`` in a collection made now, after ``flush()`` (the
        durations waiting are recorded first) unless ``flush=False``."""
        if flush:
            redlease.metrics.flush()
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                if scope.scope.name != "redlease":
                    continue
                for m in scope.metrics:
                    if m.name == metric:
                        found.extend(m.data.data_points)
        return found

    def matching(self, metric: str, attrs: dict[str, str], *, flush: bool = True) -> list[Any]:
        want = {KEYS[k]: v for k, v in attrs.items()}
        return [
            p
            for p in self.points(metric, flush=flush)
            if all(p.attributes.get(k) == v for k, v in want.items())
        ]

    def count(self, metric: str, **attrs: str) -> int:
        """A counter's total over the points whose attributes include ``attrs`` (by
        their keywords in ``KEYS``)."""
        return sum(int(p.value) for p in self.matching(metric, attrs))

    def histogram(self, metric: str, *, flush: bool = True, **attrs: str) -> tuple[int, float]:
        """How many durations were recorded, and their sum."""
        points = self.matching(metric, attrs, flush=flush)
        return sum(p.count for p in points), sum(p.sum for p in points)

    def attribute_sets(self) -> list[dict[str, Any]]:
        return [
            dict(p.attributes)
            for m in ("redlease.lock.acquisitions", "redlease.lock.hold.duration")
            for p in self.points(m)
        ]


def _python(code: str) -> str:
    """What ``code`` prints, run in a fresh interpreter (which must exit 0)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def read() -> Iterator[Read]:
    """redlease's metrics go to a provider of this test's own (the global one can be set
    only once per process), and back to the default afterwards."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    redlease.metrics.configure(meter_provider=provider, durations=True)
    try:
        yield Read(reader, provider)
    finally:
        redlease.metrics.flush()  # (into this provider, before it shuts down)
        redlease.metrics.configure()
        provider.shutdown()


HELD = 0.05


def test_acquisitions_waits_and_holds(twin: Any, name: str, read: Read) -> None:
    lock = twin.lock(name, ttl=10.0)
    for _ in range(2):
        lease = lock.acquire(timeout=5.0)
        time.sleep(HELD)
        lease.release()
    assert read.count("redlease.lock.acquisitions", kind="lock") == 2
    waits, _ = read.histogram("redlease.lock.wait.duration", kind="lock", outcome="acquired")
    assert waits == 2
    holds, held = read.histogram("redlease.lock.hold.duration", kind="lock", outcome="released")
    assert holds == 2
    assert held >= 2 * HELD
    assert read.count("redlease.lock.timeouts") == 0
    assert read.count("redlease.lease.lost") == 0


def test_a_timeout_and_a_busy_try(twin: Any, name: str, read: Read) -> None:
    lock = twin.lock(name, ttl=10.0)
    holder = lock.acquire()
    with pytest.raises(redlease.AcquireTimeout):
        lock.acquire(timeout=HELD)
    assert lock.try_acquire() is None
    holder.release()
    assert read.count("redlease.lock.timeouts", kind="lock") == 1
    timeouts, waited = read.histogram("redlease.lock.wait.duration", kind="lock", outcome="timeout")
    assert timeouts == 1
    assert waited >= HELD
    busy, _ = read.histogram("redlease.lock.wait.duration", kind="lock", outcome="busy")
    assert busy == 1
    assert read.count("redlease.lock.acquisitions") == 1  # the holder's only


def test_a_scheduled_jobs_runs_and_skips(twin: Any, name: str, read: Read) -> None:
    job, hourly = twin.once(name, at_most=10), twin.once(name, at_most=10, every=3600)
    run = job.begin()
    assert isinstance(job.begin(), redlease.Skipped)
    run.release()
    hourly.begin().release()
    assert isinstance(hourly.begin(), redlease.Skipped)
    assert read.count("redlease.lock.acquisitions", kind="once") == 2
    assert read.count("redlease.once.skips", kind="once", reason="running") == 1
    assert read.count("redlease.once.skips", kind="once", reason="ran this period") == 1
    held, _ = read.histogram("redlease.lock.hold.duration", kind="once", outcome="released")
    assert held == 2


def test_a_lost_lease_and_its_failed_renewal(
    twin: Any, r: redis.Redis, name: str, read: Read
) -> None:
    # (a lease of 5 s: its renewal, due long before it ends, is refused, and that is how
    # it is found lost; with 1 s a late renewer on a loaded machine found it run out)
    lock = twin.lock(name, ttl=5.0, auto_renew=True)
    lease = lock.acquire()
    r.delete(lock_key(name))  # gone under it: the next renewal is refused
    wait_until(lambda: lease.lost, 30)
    wait_until(lambda: read.count("redlease.lease.lost") == 1)
    assert read.count("redlease.lease.lost", kind="lock") == 1
    assert read.count("redlease.renewal.failures", kind="lock", error_type="LockLost") == 1
    lost, _ = read.histogram("redlease.lock.hold.duration", kind="lock", outcome="lost")
    assert lost == 1
    with pytest.raises(redlease.LockLost):
        lease.release()
    assert read.count("redlease.lease.lost") == 1  # counted once, whoever finds it


def test_names_only_when_asked_for(r: redis.Redis, name: str, read: Read) -> None:
    lock = redlease.Lock(r, name)
    lock.acquire().release()
    sets = read.attribute_sets()
    assert sets
    assert all(KEYS["name"] not in s for s in sets)

    redlease.metrics.configure(meter_provider=read.provider, record_names=True, durations=True)
    lock.acquire().release()  # the same lock object follows the new configuration
    assert read.count("redlease.lock.acquisitions", name=name) == 1
    assert read.count("redlease.lock.acquisitions", kind="lock") == 2


def test_configure_refuses_what_it_cannot_use() -> None:
    with pytest.raises(redlease.InvalidArgument, match="record_names"):
        redlease.metrics.configure(record_names="yes")  # type: ignore[arg-type]
    with pytest.raises(redlease.InvalidArgument, match="durations"):
        redlease.metrics.configure(durations=None)  # type: ignore[arg-type]
    with pytest.raises(redlease.InvalidArgument, match="enabled"):
        redlease.metrics.configure(enabled=1)  # type: ignore[arg-type]
    with pytest.raises(redlease.InvalidArgument, match="MeterProvider"):
        redlease.metrics.configure(meter_provider=object())  # type: ignore[arg-type]


def test_switched_off_records_nothing(r: redis.Redis, name: str, read: Read) -> None:
    redlease.metrics.configure(enabled=False)
    assert not redlease.metrics.enabled()
    redlease.Lock(r, name).acquire().release()
    assert read.points("redlease.lock.acquisitions") == []


def test_counters_only_by_default(r: redis.Redis, name: str, read: Read) -> None:
    # The histograms cost the SDK a record per acquire and per release: asked for only.
    redlease.metrics.configure(meter_provider=read.provider)
    for _ in range(3):  # a lock object per call: the counts add up all the same
        redlease.Lock(r, name).acquire().release()
    assert read.count("redlease.lock.acquisitions", kind="lock") == 3
    assert read.points("redlease.lock.wait.duration") == []
    assert read.points("redlease.lock.hold.duration") == []


def test_each_primitive_says_its_kind(
    server: servers.ServerProcess, r: redis.Redis, name: str, read: Read
) -> None:
    redlease.Semaphore(r, name, 2).acquire().release()
    rw = redlease.ReadWriteLock(r, name + ":rw")
    rw.read.acquire().release()
    rw.write.acquire().release()
    redlease.MultiLock(r, [name + ":a", name + ":b"]).acquire().release()
    election = redlease.Election(r, name + ":e")
    election.campaign()
    election.resign()
    nodes = [redis.Redis(port=server.port, db=db) for db in (1, 2, 3)]
    try:
        redlease.Redlock(nodes, name).acquire().release()
    finally:
        for node in nodes:
            node.close()
    acquired = "redlease.lock.acquisitions"
    assert read.count(acquired, kind="semaphore") == 1
    assert read.count(acquired, kind="rwlock", mode="read") == 1
    assert read.count(acquired, kind="rwlock", mode="write") == 1
    assert read.count(acquired, kind="multilock") == 2  # one per name
    assert read.count(acquired, kind="election") == 1
    assert read.count(acquired, kind="redlock") == 1
    assert read.count(acquired, kind="lock") == 0
    holds, _ = read.histogram("redlease.lock.hold.duration", kind="redlock", outcome="released")
    assert holds == 1


def test_without_opentelemetry_nothing_is_recorded(
    server: servers.ServerProcess, name: str
) -> None:
    code = f"""
import sys
sys.modules["opentelemetry"] = None  # as if not installed: importing it raises
import redis, redlease
from redlease._base import metrics as _metrics
r = redis.Redis(port={server.port})
redlease.metrics.configure(record_names=True, durations=True)
lock = redlease.Lock(r, {name!r}, auto_renew=True)
with lock as lease:
    assert lease.fence >= 1
assert lock.try_acquire() is not None
assert not redlease.metrics.enabled()
assert _metrics.instruments() is None
print("ok")
"""
    assert _python(code) == "ok"


# -- the durations' queue ---------------------------------------------------------------

HOLD = "redlease.lock.hold.duration"
WAIT = "redlease.lock.wait.duration"


def test_a_collection_takes_the_durations_waiting(r: redis.Redis, name: str, read: Read) -> None:
    lock = redlease.Lock(r, name)
    for _ in range(2):
        lock.acquire().release()
    # No flush: the collection's callback drains the queue. This SDK reads its storage
    # after its callbacks, so the first collection has them; one that read it before
    # would have them in the next (documented: at most one export late).
    holds = [read.histogram(HOLD, kind="lock", flush=False)[0] for _ in range(2)]
    assert holds[-1] == 2
    assert read.histogram(WAIT, kind="lock", outcome="acquired", flush=False)[0] == 2


def test_the_drainer_records_without_a_collection(r: redis.Redis, name: str, read: Read) -> None:
    lock = redlease.Lock(r, name)
    for _ in range(3):
        lock.acquire().release()
    # Nothing collects and nothing flushes: the redlease-metrics thread hands the
    # durations over on its own (within a second; 10 s allowed for a slow machine).
    wait_until(lambda: _metrics.deferred.pending() == 0)
    assert "redlease-metrics" in {t.name for t in threading.enumerate()}
    assert read.histogram(HOLD, kind="lock")[0] == 3


class Recorded:
    """A meter provider that is not an SDK: its histograms write the pid of the process
    that records each value to a file (a forked child's lines are told from its
    parent's), and its counters do nothing. Nothing ever collects it, so nothing drains
    redlease's queue but redlease itself."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get_meter(self, name: str, version: str | None = None) -> Recorded:
        return self

    def create_histogram(self, name: str, **options: Any) -> Recorded:
        return self

    def create_counter(self, name: str, **options: Any) -> Recorded:
        return self

    def create_observable_counter(self, name: str, **options: Any) -> None:
        return None

    def record(self, value: float, attributes: Any = None, context: Any = None) -> None:
        with self.path.open("a") as out:
            out.write(f"{os.getpid()}\n")

    def add(self, value: int, attributes: Any = None) -> None:
        pass

    def by_pid(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for line in self.path.read_text().split():
            counts[int(line)] = counts.get(int(line), 0) + 1
        return counts


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_forked_child_records_its_own_durations_only(
    server: servers.ServerProcess, r: redis.Redis, name: str, tmp_path: Path
) -> None:
    recorded = Recorded(tmp_path / "records")
    redlease.metrics.configure(meter_provider=recorded, durations=True)  # type: ignore[arg-type]
    try:
        lock = redlease.Lock(r, name)
        for _ in range(3):
            lock.acquire().release()  # 6 durations, most likely still queued at the fork
        with warnings.catch_warnings():  # (3.12+: a fork with threads running warns)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: records 2 cycles, and leaves at once
            code = 1
            try:
                client = redis.Redis(port=server.port)
                redlease.Lock(client, name + ":child").acquire().release()
                redlease.Lock(client, name + ":child").acquire().release()
                # a drainer of its own (the parent's did not follow it)
                wait_until(lambda: _metrics.deferred.pending() == 0)
                redlease.metrics.flush()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        redlease.metrics.flush()
        assert recorded.by_pid() == {os.getpid(): 6, pid: 4}
    finally:
        redlease.metrics.configure()


def test_the_durations_waiting_at_exit_are_recorded(
    server: servers.ServerProcess, name: str, tmp_path: Path
) -> None:
    # A short process (a CLI run): it records and exits well before the drainer's next
    # wake-up, to a provider that never collects. Its own atexit function, registered
    # before any record, runs after redlease's (atexit runs them last in, first out).
    code = f"""
import atexit, os, sys
from pathlib import Path
sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
import redis, redlease
from test_metrics import Recorded
recorded = Recorded(Path({str(tmp_path / "records")!r}))
atexit.register(lambda: print(sum(recorded.by_pid().values()) if recorded.path.exists() else 0))
redlease.metrics.configure(meter_provider=recorded, durations=True)
lock = redlease.Lock(redis.Redis(port={server.port}), {name!r})
for _ in range(3):
    lock.acquire().release()
"""
    assert _python(code) == "6"


def test_a_duration_keeps_the_callers_trace(r: redis.Redis, name: str, read: Read) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("job") as span:
        redlease.Lock(r, name).acquire().release()
    trace_id = span.get_span_context().trace_id
    # Recorded later, by another thread: the exemplar (the SDK's default filter samples
    # the durations recorded under a sampled span) still names the caller's trace. (One
    # collection for both: each takes the exemplars it reports.)
    redlease.metrics.flush()
    data = read.reader.get_metrics_data()
    assert data is not None
    traced = {
        metric.name: {e.trace_id for p in metric.data.data_points for e in p.exemplars}
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert trace_id in traced[WAIT]
    assert trace_id in traced[HOLD]


def test_a_full_queue_drops_and_says_so(
    r: redis.Redis,
    name: str,
    read: Read,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(_metrics, "PENDING_LIMIT", 0)  # full from the start
    lock = redlease.Lock(r, name)
    with caplog.at_level("WARNING", logger="redlease"):
        for _ in range(2):
            lock.acquire().release()
        redlease.metrics.flush()
    assert read.histogram(HOLD)[0] == 0
    assert read.count("redlease.lock.acquisitions", kind="lock") == 2  # counted all the same
    said = [rec.getMessage() for rec in caplog.records if "dropped" in rec.getMessage()]
    assert said
    assert sum(int(m.split()[0]) for m in said) == 4  # 2 waits and 2 holds
