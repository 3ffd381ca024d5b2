"""Sections 1 and 2: uncontended acquire+release cycles per second.

Every contender repeats "acquire a free lock, release it" on its own key. All of them,
sync and asyncio, one server and several masters, run in the same interleaved rounds
(shuffled order each round, one event loop for the asyncio ones); each figure is the
median of its rounds, and each ratio is taken against the floor of the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import random
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aredis

import redlease
from redlease._wire import resp as _wire

from ._common import Settings, describe_error, median
from ._report import NA, Row, rate, times, verdict
from .raw import RELEASE_SCRIPT, redlock_cycle

SINGLE = "1. uncontended acquire+release, one server"
REDLOCK = "2. uncontended Redlock acquire+release, independent masters"

TTL = 10.0
BATCH = 5  # cycles between two looks at the clock


@dataclass(frozen=True)
class Node:
    """One server (or one database of a server, for tests that have a single server)."""

    port: int
    db: int = 0
    host: str = "127.0.0.1"

    def sync(self) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, db=self.db)

    def asyncio(self) -> aredis.Redis:
        return aredis.Redis(host=self.host, port=self.port, db=self.db)

    def params(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "db": self.db}


SyncCycle = Callable[[], None]
AsyncCycle = Callable[[], Awaitable[None]]


class NotAvailable(Exception):
    """The contender cannot run here; the message says why."""


@dataclass
class Entry:
    section: str
    key: str
    label: str
    sync: SyncCycle | None = None
    asyncio: AsyncCycle | None = None
    rates: list[float] = field(default_factory=list)
    problem: str | None = None  # printed instead of a figure
    # Set up around each of its slots (and undone after): what the process is configured
    # with while it runs, e.g. metrics on or off.
    mode: Callable[[], AbstractContextManager[None]] | None = None
    # Run at the end of each timed slot, inside its time: work the cycles left for later
    # is charged to them, not to the next row (metrics: the durations still queued).
    settle: Callable[[], None] | None = None

    @property
    def result(self) -> float:
        return median(self.rates) if self.problem is None else float("nan")


class Bench:
    """Builds the contenders, owns their clients, and closes everything at the end."""

    def __init__(self, nodes: Sequence[Node], loop: asyncio.AbstractEventLoop) -> None:
        self.nodes = list(nodes)
        self.loop = loop
        self.entries: list[Entry] = []
        self._closers: list[Callable[[], None]] = []
        self._async_closers: list[Callable[[], Awaitable[Any]]] = []
        self.metrics: Metrics | None = None  # the metrics pair's, when it runs

    def sync_client(self, node: Node) -> redis.Redis:
        client = node.sync()
        self._closers.append(client.close)
        return client

    def async_client(self, node: Node) -> aredis.Redis:
        client = node.asyncio()
        self._async_closers.append(client.aclose)
        return client

    def owned(self, client: Any) -> Any:
        """A client made elsewhere, closed with the others at the end."""
        if callable(getattr(client, "aclose", None)):
            self._async_closers.append(client.aclose)
        elif callable(getattr(client, "close", None)):
            self._closers.append(client.close)
        return client

    def add(
        self,
        section: str,
        key: str,
        label: str,
        build: Callable[[str], SyncCycle | AsyncCycle],
        mode: Callable[[], AbstractContextManager[None]] | None = None,
        settle: Callable[[], None] | None = None,
    ) -> None:
        entry = Entry(section, key, label, mode=mode, settle=settle)
        self.entries.append(entry)
        try:
            cycle = build(f"bench:u:{key}")
        except (NotAvailable, NotImplementedError) as exc:
            entry.problem = f"{NA} ({exc})"
            return
        except Exception as exc:
            entry.problem = f"error: {describe_error(exc)}"
            return
        if inspect.iscoroutinefunction(cycle):
            entry.asyncio = cycle
        else:
            entry.sync = cycle  # type: ignore[assignment]

    def run_async(self, coro: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        for close_async in reversed(self._async_closers):
            with contextlib.suppress(Exception):
                self.run_async(close_async())
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                close()


# -- the contenders -------------------------------------------------------------------


def _floor(bench: Bench, node: Node) -> Callable[[str], SyncCycle]:
    def build(key: str) -> SyncCycle:
        r = bench.sync_client(node)
        sha = r.script_load(RELEASE_SCRIPT)

        def cycle() -> None:
            token = os.urandom(16).hex()
            if not r.set(key, token, nx=True, px=int(TTL * 1000)):
                raise RuntimeError("floor: key was taken")
            r.evalsha(sha, 1, key, token)

        return cycle

    return build


def _floor_direct(bench: Bench, node: Node) -> Callable[[str], SyncCycle]:
    """The same two commands written straight to one connection (no command path)."""

    def build(key: str) -> SyncCycle:
        r = bench.sync_client(node)
        sha = r.script_load(RELEASE_SCRIPT)
        pool = r.connection_pool
        conn: Any = pool.get_connection()
        bench._closers.append(lambda: pool.release(conn))
        px = str(int(TTL * 1000))

        def cycle() -> None:
            token = os.urandom(16).hex()
            conn.send_command("SET", key, token, "NX", "PX", px)
            if conn.read_response() is None:
                raise RuntimeError("direct floor: key was taken")
            conn.send_command("EVALSHA", sha, "1", key, token)
            conn.read_response()

        return cycle

    return build


def _redlock_direct(bench: Bench, nodes: Sequence[Node]) -> Callable[[str], SyncCycle]:
    """A hand-written Redlock cycle at its plainest (``raw.redlock_cycle``): what is
    left once the lock's own work is skipped."""

    def build(key: str) -> SyncCycle:
        conns: list[Any] = []
        sha = ""
        for node in nodes:
            r = bench.sync_client(node)
            sha = r.script_load(RELEASE_SCRIPT)
            pool = r.connection_pool
            conn = pool.get_connection()
            bench._closers.append(functools.partial(pool.release, conn))
            conns.append(conn)
        return functools.partial(redlock_cycle, conns, sha, key, str(int(TTL * 1000)))

    return build


def _redlease_lock(
    bench: Bench, node: Node, family: Callable[[Node], Any] | None = None
) -> Callable[[str], SyncCycle]:
    """``family``: the client of another family to go through (a per-family row)."""

    def build(key: str) -> SyncCycle:
        client = bench.sync_client(node) if family is None else bench.owned(family(node))
        lock = redlease.Lock(client, key, ttl=TTL)

        def cycle() -> None:
            lock.acquire().release()

        return cycle

    return build


def _redlease_other(bench: Bench, node: Node, what: str) -> Callable[[str], SyncCycle]:
    """A permit of a Semaphore (limit 4), a read or a write lease of a ReadWriteLock."""

    def build(key: str) -> SyncCycle:
        client = bench.sync_client(node)
        if what == "permit":
            side: Any = redlease.Semaphore(client, key, 4, ttl=TTL)
        else:
            rw = redlease.ReadWriteLock(client, key, ttl=TTL)
            side = rw.read if what == "read" else rw.write

        def cycle() -> None:
            side.acquire().release()

        return cycle

    return build


def _tooz(bench: Bench, node: Node) -> Callable[[str], SyncCycle]:
    def build(key: str) -> SyncCycle:
        try:
            from tooz import coordination
        except ImportError as exc:
            raise NotAvailable("tooz not installed") from exc
        coordinator = coordination.get_coordinator(
            f"redis://{node.host}:{node.port}?db={node.db}", b"bench"
        )
        coordinator.start()
        bench._closers.append(coordinator.stop)
        lock = coordinator.get_lock(key.encode())

        def cycle() -> None:
            if not lock.acquire(blocking=True):
                raise RuntimeError("tooz lock not acquired")
            lock.release()

        return cycle

    return build


def _valkey(node: Node) -> Any:
    try:
        import valkey
    except ImportError as exc:
        raise NotAvailable("valkey-py is not installed") from exc
    return valkey.Valkey(**node.params())


def _avalkey(node: Node) -> Any:
    try:
        import valkey.asyncio
    except ImportError as exc:
        raise NotAvailable("valkey-py is not installed") from exc
    return valkey.asyncio.Valkey(**node.params())


def _coredis(node: Node) -> Any:
    try:
        import coredis
    except ImportError as exc:
        raise NotAvailable("coredis is not installed") from exc
    return coredis.Redis(**node.params())  # redlease never opens its connections


@contextlib.contextmanager
def _spin_off() -> Iterator[None]:
    saved, _wire.BUDGET = _wire.BUDGET, 0.0
    try:
        yield
    finally:
        _wire.BUDGET = saved


def _no_spin(build: Callable[[str], SyncCycle]) -> Callable[[str], SyncCycle]:
    """The same contender with the drivers' polling reads off (REDLEASE_SPIN_US=0)."""

    def build_quiet(key: str) -> SyncCycle:
        cycle = build(key)

        def quiet() -> None:
            with _spin_off():
                cycle()

        return quiet

    return build_quiet


def _no_spin_async(build: Callable[[str], AsyncCycle]) -> Callable[[str], AsyncCycle]:
    """The asyncio twin of ``_no_spin``."""

    def build_quiet(key: str) -> AsyncCycle:
        cycle = build(key)

        async def quiet() -> None:
            with _spin_off():
                await cycle()

        return quiet

    return build_quiet


class Metrics:
    """redlease's OpenTelemetry metrics as a user with the SDK has them (a MeterProvider
    with a reader: in memory here, the cost of recording is the same), with the
    durations too, or switched off; each for one slot at a time, so all three run in the
    same interleaved rounds.

    With ``durations=True`` the durations reach the SDK from a background thread
    (redlease-metrics), in the same process: its work during a slot slows that slot's
    cycles, and what is still queued at the end of a slot is flushed inside the slot's
    time (``settle``), so each row pays for its own records and none for another's."""

    def __init__(self) -> None:
        try:
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        except ImportError as exc:
            raise NotAvailable("opentelemetry-sdk is not installed") from exc
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        redlease.metrics.configure(meter_provider=self.provider)
        try:
            yield
        finally:
            redlease.metrics.configure()

    @contextlib.contextmanager
    def durations(self) -> Iterator[None]:
        redlease.metrics.configure(meter_provider=self.provider, durations=True)
        try:
            yield
        finally:
            redlease.metrics.configure()

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        redlease.metrics.configure(enabled=False)
        try:
            yield
        finally:
            redlease.metrics.configure()

    def recorded(self) -> int:
        """Acquisitions the reader has seen (the "on" contender did record)."""
        from opentelemetry.sdk.metrics.export import NumberDataPoint

        data = self.reader.get_metrics_data()
        return sum(
            int(point.value)
            for resource in (data.resource_metrics if data is not None else ())
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == "redlease.lock.acquisitions"
            for point in metric.data.data_points
            if isinstance(point, NumberDataPoint)
        )


METRICS_ON = ("redlease-otel-on", "redlease-otel-durations")


def _metrics_rows(bench: Bench, node: Node) -> None:
    """The same Lock cycle with metrics off, on (SDK, in-memory reader: the counters),
    and on with the two duration histograms as well (asked for)."""
    try:
        metrics = Metrics()
    except NotAvailable as exc:
        for key in ("redlease-otel-off", *METRICS_ON):
            bench.add(SINGLE, key, f"redlease Lock, {key}", _unavailable(str(exc)))
        return
    bench.metrics = metrics
    bench.add(
        SINGLE,
        "redlease-otel-off",
        "redlease Lock, metrics off (metrics.configure(enabled=False))",
        _redlease_lock(bench, node),
        mode=metrics.off,
        settle=redlease.metrics.flush,
    )
    bench.add(
        SINGLE,
        "redlease-otel-on",
        "redlease Lock, metrics on (OTel SDK, in-memory reader; default: counters)",
        _redlease_lock(bench, node),
        mode=metrics.on,
        settle=redlease.metrics.flush,
    )
    bench.add(
        SINGLE,
        "redlease-otel-durations",
        "redlease Lock, metrics on, durations=True (histograms too)",
        _redlease_lock(bench, node),
        mode=metrics.durations,
        settle=redlease.metrics.flush,
    )


def _unavailable(why: str) -> Callable[[str], SyncCycle]:
    def build(key: str) -> SyncCycle:
        raise NotAvailable(why)

    return build


def _redis_py_lock(bench: Bench, node: Node) -> Callable[[str], SyncCycle]:
    def build(key: str) -> SyncCycle:
        lock = bench.sync_client(node).lock(key, timeout=TTL)

        def cycle() -> None:
            if not lock.acquire():
                raise RuntimeError("redis-py Lock not acquired")
            lock.release()

        return cycle

    return build


def _python_redis_lock(bench: Bench, node: Node) -> Callable[[str], SyncCycle]:
    def build(key: str) -> SyncCycle:
        try:
            import redis_lock
        except ImportError as exc:
            raise NotAvailable("python-redis-lock not installed") from exc
        lock = redis_lock.Lock(bench.sync_client(node), key, expire=int(TTL))

        def cycle() -> None:
            if not lock.acquire():
                raise RuntimeError("python-redis-lock not acquired")
            lock.release()

        return cycle

    return build


def _pottery(bench: Bench, nodes: Sequence[Node]) -> Callable[[str], SyncCycle]:
    def build(key: str) -> SyncCycle:
        try:
            from pottery import Redlock
        except ImportError as exc:
            raise NotAvailable("pottery not installed") from exc
        masters = {bench.sync_client(n) for n in nodes}
        lock = Redlock(key=key, masters=masters, auto_release_time=TTL)

        def cycle() -> None:
            if not lock.acquire():
                raise RuntimeError("pottery Redlock not acquired")
            lock.release()

        return cycle

    return build


def _redlock_py(bench: Bench, nodes: Sequence[Node]) -> Callable[[str], SyncCycle]:
    def build(key: str) -> SyncCycle:
        try:
            import redlock
        except ImportError as exc:
            raise NotAvailable("redlock-py not installed") from exc
        manager = redlock.Redlock([n.params() for n in nodes], retry_count=3)
        for server in manager.servers:
            bench._closers.append(server.close)

        def cycle() -> None:
            held = manager.lock(key, int(TTL * 1000))
            if not held:
                raise RuntimeError("redlock-py lock not acquired")
            manager.unlock(held)

        return cycle

    return build


def _redlease_redlock(bench: Bench, nodes: Sequence[Node]) -> Callable[[str], SyncCycle]:
    def build(key: str) -> SyncCycle:
        lock = redlease.Redlock([bench.sync_client(n) for n in nodes], key, ttl=TTL)

        def cycle() -> None:
            lock.acquire().release()

        return cycle

    return build


def _floor_async(bench: Bench, node: Node) -> Callable[[str], AsyncCycle]:
    def build(key: str) -> AsyncCycle:
        r = bench.async_client(node)
        sha = bench.run_async(r.script_load(RELEASE_SCRIPT))

        async def cycle() -> None:
            token = os.urandom(16).hex()
            if not await r.set(key, token, nx=True, px=int(TTL * 1000)):
                raise RuntimeError("floor: key was taken")
            await r.evalsha(sha, 1, key, token)

        return cycle

    return build


def _floor_async_direct(bench: Bench, node: Node) -> Callable[[str], AsyncCycle]:
    """The asyncio floor's two commands written straight to one connection."""

    def build(key: str) -> AsyncCycle:
        r = bench.async_client(node)
        sha = bench.run_async(r.script_load(RELEASE_SCRIPT))
        pool = r.connection_pool
        conn: Any = bench.run_async(pool.get_connection())  # type: ignore[no-untyped-call]
        px = str(int(TTL * 1000))

        async def cycle() -> None:
            token = os.urandom(16).hex()
            await conn.send_command("SET", key, token, "NX", "PX", px)
            if await conn.read_response() is None:
                raise RuntimeError("direct asyncio floor: key was taken")
            await conn.send_command("EVALSHA", sha, "1", key, token)
            await conn.read_response()

        return cycle

    return build


def _redlease_async(
    bench: Bench, node: Node, family: Callable[[Node], Any] | None = None
) -> Callable[[str], AsyncCycle]:
    def build(key: str) -> AsyncCycle:
        client = bench.async_client(node) if family is None else bench.owned(family(node))
        lock = redlease.AsyncLock(client, key, ttl=TTL)

        async def cycle() -> None:
            lease = await lock.acquire()
            await lease.release()

        return cycle

    return build


def _redlease_async_read(bench: Bench, node: Node) -> Callable[[str], AsyncCycle]:
    def build(key: str) -> AsyncCycle:
        rw = redlease.AsyncReadWriteLock(bench.async_client(node), key, ttl=TTL)

        async def cycle() -> None:
            lease = await rw.read.acquire()
            await lease.release()

        return cycle

    return build


def _aiorwlock(bench: Bench, node: Node) -> Callable[[str], AsyncCycle]:
    """A read lock within one event loop (no server): what sharing costs in-process."""

    def build(key: str) -> AsyncCycle:
        try:
            import aiorwlock
        except ImportError as exc:
            raise NotAvailable("aiorwlock not installed") from exc

        async def make() -> Any:
            return aiorwlock.RWLock()

        rw = bench.run_async(make())

        async def cycle() -> None:
            await rw.reader_lock.acquire()
            rw.reader_lock.release()

        return cycle

    return build


def _redis_py_async(bench: Bench, node: Node) -> Callable[[str], AsyncCycle]:
    def build(key: str) -> AsyncCycle:
        lock = bench.async_client(node).lock(key, timeout=TTL)

        async def cycle() -> None:
            if not await lock.acquire():
                raise RuntimeError("redis-py asyncio Lock not acquired")
            await lock.release()

        return cycle

    return build


def _aioredlock(bench: Bench, nodes: Sequence[Node]) -> Callable[[str], AsyncCycle]:
    def build(key: str) -> AsyncCycle:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                from aioredlock import Aioredlock
        except ImportError as exc:
            raise NotAvailable("aioredlock not installed") from exc
        manager = Aioredlock([n.params() for n in nodes], retry_count=3)
        bench._async_closers.append(manager.destroy)

        async def cycle() -> None:
            held = await manager.lock(key, lock_timeout=TTL)
            await manager.unlock(held)

        return cycle

    return build


def _redlease_async_redlock(bench: Bench, nodes: Sequence[Node]) -> Callable[[str], AsyncCycle]:
    def build(key: str) -> AsyncCycle:
        lock = redlease.AsyncRedlock([bench.async_client(n) for n in nodes], key, ttl=TTL)

        async def cycle() -> None:
            lease = await lock.acquire()
            await lease.release()

        return cycle

    return build


def build_entries(bench: Bench, *, single: bool, redlock: bool, masters: Sequence[int]) -> None:
    one = bench.nodes[0]
    bench.add(SINGLE, "floor", "floor: redis-py SET NX PX + EVALSHA", _floor(bench, one))
    if single:
        bench.add(
            SINGLE, "direct", "(reference) same 2 commands, raw conn", _floor_direct(bench, one)
        )
        bench.add(SINGLE, "redlease", "redlease Lock (fenced)", _redlease_lock(bench, one))
        bench.add(
            SINGLE,
            "redlease-no-spin",
            "redlease Lock, REDLEASE_SPIN_US=0",
            _no_spin(_redlease_lock(bench, one)),
        )
        _metrics_rows(bench, one)
        bench.add(
            SINGLE,
            "redlease-valkey",
            "redlease Lock, valkey-py client",
            _redlease_lock(bench, one, _valkey),
        )
        for what, label in (
            ("permit", "redlease Semaphore permit (limit 4)"),
            ("read", "redlease ReadWriteLock read lease"),
            ("write", "redlease ReadWriteLock write lease"),
        ):
            bench.add(SINGLE, f"redlease-{what}", label, _redlease_other(bench, one, what))
        bench.add(SINGLE, "redis-py", "redis-py Lock", _redis_py_lock(bench, one))
        bench.add(SINGLE, "tooz", "tooz Lock (Redis driver)", _tooz(bench, one))
        bench.add(SINGLE, "prl", "python-redis-lock", _python_redis_lock(bench, one))
        bench.add(SINGLE, "pottery-1", "pottery Redlock, 1 master", _pottery(bench, [one]))
        bench.add(SINGLE, "redlock-py-1", "redlock-py, 1 master", _redlock_py(bench, [one]))
        bench.add(
            SINGLE, "afloor", "(asyncio) floor: SET NX PX + EVALSHA", _floor_async(bench, one)
        )
        bench.add(
            SINGLE,
            "adirect",
            "(asyncio) (reference) same 2 commands, raw conn",
            _floor_async_direct(bench, one),
        )
        bench.add(
            SINGLE, "aredis-py", "(asyncio) redis-py asyncio Lock", _redis_py_async(bench, one)
        )
        bench.add(SINGLE, "aredlease", "(asyncio) redlease AsyncLock", _redlease_async(bench, one))
        bench.add(
            SINGLE,
            "aredlease-read",
            "(asyncio) redlease AsyncReadWriteLock read lease",
            _redlease_async_read(bench, one),
        )
        bench.add(
            SINGLE,
            "aiorwlock",
            "(asyncio) (reference) aiorwlock read lock, in-process, no server",
            _aiorwlock(bench, one),
        )
        bench.add(
            SINGLE,
            "aredlease-valkey",
            "(asyncio) redlease AsyncLock, valkey-py client",
            _redlease_async(bench, one, _avalkey),
        )
        bench.add(
            SINGLE,
            "aredlease-coredis",
            "(asyncio) redlease AsyncLock, coredis client",
            _redlease_async(bench, one, _coredis),
        )
        bench.add(
            SINGLE,
            "aredlease-no-spin",
            "(asyncio) redlease AsyncLock, REDLEASE_SPIN_US=0",
            _no_spin_async(_redlease_async(bench, one)),
        )
        bench.add(
            SINGLE, "aioredlock-1", "(asyncio) aioredlock, 1 master", _aioredlock(bench, [one])
        )
    if redlock:
        if len(bench.nodes) >= max(masters):
            bench.add(
                REDLOCK,
                "rl-direct",
                f"(reference) {max(masters)} masters, raw conns",
                _redlock_direct(bench, bench.nodes[: max(masters)]),
            )
        for n in masters:
            group = bench.nodes[:n]
            if len(group) < n:
                continue
            bench.add(
                REDLOCK,
                f"rl-{n}",
                f"redlease Redlock, {n} masters",
                _redlease_redlock(bench, group),
            )
            if n == max(masters):
                bench.add(
                    REDLOCK,
                    f"rl-{n}-no-spin",
                    f"redlease Redlock, {n} masters, REDLEASE_SPIN_US=0",
                    _no_spin(_redlease_redlock(bench, group)),
                )
        for n in masters:
            group = bench.nodes[:n]
            if len(group) < n:
                continue
            bench.add(
                REDLOCK,
                f"arl-{n}",
                f"(asyncio) redlease AsyncRedlock, {n} masters",
                _redlease_async_redlock(bench, group),
            )
        for n in masters:
            group = bench.nodes[:n]
            if len(group) < n:
                continue
            bench.add(
                REDLOCK, f"pottery-{n}", f"pottery Redlock, {n} masters", _pottery(bench, group)
            )
            bench.add(
                REDLOCK,
                f"aioredlock-{n}",
                f"(asyncio) aioredlock, {n} masters",
                _aioredlock(bench, group),
            )
            bench.add(
                REDLOCK, f"redlock-py-{n}", f"redlock-py, {n} masters", _redlock_py(bench, group)
            )


# -- measuring --------------------------------------------------------------------------


def _timed_sync(
    cycle: SyncCycle, seconds: float, settle: Callable[[], None] | None = None
) -> float:
    done = 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(BATCH):
            cycle()
        done += BATCH
        now = time.perf_counter()
        if now >= end:
            if settle is not None:
                settle()
                now = time.perf_counter()
            return done / (now - start)


async def _timed_async(cycle: AsyncCycle, seconds: float) -> float:
    done = 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(BATCH):
            await cycle()
        done += BATCH
        now = time.perf_counter()
        if now >= end:
            return done / (now - start)


def _measure_once(bench: Bench, entry: Entry, seconds: float) -> None:
    mode = contextlib.nullcontext() if entry.mode is None else entry.mode()
    try:
        with mode:
            _measure_in(bench, entry, seconds)
    except NotImplementedError as exc:
        entry.problem = f"{NA} ({exc})"
    except Exception as exc:
        entry.problem = f"error: {describe_error(exc)}"


def _measure_in(bench: Bench, entry: Entry, seconds: float) -> None:
    if entry.sync is not None:
        entry.rates.append(_timed_sync(entry.sync, seconds, entry.settle))
    elif entry.asyncio is not None:
        entry.rates.append(bench.run_async(_timed_async(entry.asyncio, seconds)))


def measure(bench: Bench, settings: Settings, seed: int = 1) -> None:
    rng = random.Random(seed)
    live = [e for e in bench.entries if e.problem is None]
    for entry in live:  # warm-up: connections, scripts loaded, caches
        _measure_once(bench, entry, min(0.05, settings.round_seconds))
        entry.rates.clear()
    for _ in range(settings.rounds):
        order = [e for e in live if e.problem is None]
        rng.shuffle(order)
        for entry in order:
            _measure_once(bench, entry, settings.round_seconds)


# -- the rows ---------------------------------------------------------------------------


def _row(entry: Entry, floor: float, *, bar: str = "", ok: bool | None = None) -> Row:
    if entry.problem is not None:
        return Row(
            entry.section,
            entry.label,
            "cycles/s",
            None,
            entry.problem,
            bar=bar,
            verdict=verdict(None) if bar else "",
        )
    value = entry.result
    return Row(
        entry.section,
        entry.label,
        "cycles/s",
        value,
        rate(value),
        ratio=times(value / floor, "floor"),
        bar=bar,
        verdict=verdict(ok) if bar else "",
        extra={"rounds": [round(r, 1) for r in entry.rates]},
    )


# The same lock through another client family, and its row through redis-py.
_VIA_OTHER_FAMILIES = {
    "redlease-valkey": "redlease",
    "aredlease-valkey": "aredlease",
    "aredlease-coredis": "aredlease",
}


def rows(bench: Bench) -> list[Row]:
    by_key = {e.key: e for e in bench.entries}
    floor = by_key["floor"].result
    out: list[Row] = []

    def ok(key: str) -> bool:
        return key in by_key and by_key[key].problem is None

    for entry in bench.entries:
        key = entry.key
        if key == "redlease":
            value = entry.result / floor
            out.append(_row(entry, floor, bar=">= 1.3x floor", ok=value >= 1.3))
        elif key == "aredlease":
            ref = by_key.get("aredis-py")
            against = entry.result / ref.result if ref and ok("aredis-py") else float("nan")
            row = _row(
                entry,
                floor,
                bar=">= 1.25x redis-py asyncio Lock",
                ok=against >= 1.25 if against == against else None,
            )
            out.append(row)
            if entry.problem is None:
                out.append(
                    Row(
                        entry.section,
                        entry.label,
                        "vs redis-py asyncio Lock",
                        against,
                        times(against, "redis-py asyncio"),
                    )
                )
        elif key in ("redlease-permit", "redlease-read", "redlease-write") and ok(key):
            # a primitive's cycle takes at most 1.3x the lock's
            against = entry.result / by_key["redlease"].result if ok("redlease") else float("nan")
            out.append(_row(entry, floor))
            out.append(
                Row(
                    entry.section,
                    entry.label,
                    "vs redlease Lock",
                    against,
                    times(against, "Lock"),
                    bar="cycle <= 1.3x Lock's",
                    verdict=verdict(against >= 1 / 1.3) if against == against else verdict(None),
                )
            )
        elif key in METRICS_ON and ok(key) and ok("redlease-otel-off"):
            # recording costs at most 5% of a cycle (both rows run in the same rounds);
            # the histograms, asked for, cost the SDK's records: shown, with no bar
            against = entry.result / by_key["redlease-otel-off"].result
            default = key == "redlease-otel-on"
            recorded = bench.metrics.recorded() if bench.metrics is not None else 0
            out.append(_row(entry, floor))
            out.append(
                Row(
                    entry.section,
                    entry.label,
                    "vs the same, metrics off",
                    against,
                    times(against, "metrics off"),
                    bar=">= 0.95x metrics off" if default else "",
                    verdict=verdict(against >= 0.95 and recorded > 0) if default else "",
                    extra={"acquisitions recorded": recorded},
                )
            )
        elif key in _VIA_OTHER_FAMILIES and ok(key) and ok(_VIA_OTHER_FAMILIES[key]):
            # a client family costs what redis-py costs, within 10%
            against = entry.result / by_key[_VIA_OTHER_FAMILIES[key]].result
            out.append(_row(entry, floor))
            out.append(
                Row(
                    entry.section,
                    entry.label,
                    "vs the same through redis-py",
                    against,
                    times(against, "via redis-py"),
                    bar=">= 0.9x via redis-py",
                    verdict=verdict(against >= 0.9),
                )
            )
        elif key == "rl-5":
            value = entry.result / floor
            out.append(_row(entry, floor, bar=">= 0.8x floor", ok=value >= 0.8))
            # against the plainest 5-master loop first (the client's own cost per node:
            # it pays the same servers' time, which on 2 cores is the limit), then peers
            for peer, label, figure, need in (
                ("rl-direct", "raw", "vs the raw 5-master cycle", 0.85),
                ("pottery-5", "pottery", "vs pottery, 5 masters", 3.0),
                ("aioredlock-5", "aioredlock", "vs aioredlock, 5 masters", 2.0),
            ):
                if entry.problem is None and ok(peer):
                    against = entry.result / by_key[peer].result
                    out.append(
                        Row(
                            entry.section,
                            entry.label,
                            figure,
                            against,
                            times(against, label),
                            bar=f">= {need:g}x {label}",
                            verdict=verdict(against >= need),
                        )
                    )
        else:
            out.append(_row(entry, floor))
    return out


def run(
    nodes: Sequence[Node],
    settings: Settings,
    *,
    single: bool = True,
    redlock: bool = True,
    masters: Sequence[int] = (3, 5),
) -> list[Row]:
    loop = asyncio.new_event_loop()
    bench = Bench(nodes, loop)
    try:
        build_entries(bench, single=single, redlock=redlock, masters=masters)
        measure(bench, settings)
        return rows(bench)
    finally:
        bench.close()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
