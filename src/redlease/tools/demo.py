"""``redlease demo``: the articles' phone-number scenario, run for real.

A call centre keeps its phone numbers in a table (SQLite here). To place a call a worker
reads the first idle number, marks it busy for itself and dials it. Several worker
processes do this at once; between the read and the write there is a short gap, and a
second worker that reads in that gap gets the same "idle" number. Each mode runs on a
fresh table with fresh processes:

* ``unlocked``: no lock at all;
* the wrong locks of ``redlease.tools.broken`` (SETNX then EXPIRE, GETSET timestamp, plain DEL,
  GET then DEL);
* ``redlease`` (one server) and ``redlock`` (three independent servers, when available).

The second part pauses one holder inside its critical section for longer than its lease,
as a GC pause or SIGSTOP would. No TTL lock can stop a second worker from coming in then;
the table shows that, and shows fencing stopping the damage: every claim carries
``lease.fence``, the table records the highest fence that has touched it (on the read) and
refuses a write from an older one. With PostgreSQL at hand (the ``postgres`` extra), one more
run keeps the table there and lets redlease's SQL fence gate (``redlease.sql``) do the
refusing: the claim's read and its write each pass the gate first.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import queue
import random
import secrets
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from .._clients import from_url
from . import broken

__all__ = [
    "BROKEN_MODES",
    "DemoConfig",
    "DemoReport",
    "ModeResult",
    "RunSpec",
    "redlock_status",
    "run_demo",
    "run_mode",
]

BROKEN_MODES = ("setnx-expire", "getset", "plain-del", "get-del")
ALL_MODES = ("unlocked", *BROKEN_MODES, "redlease", "redlock")
FENCED_MODES = ("redlease", "redlock")

LABELS = {
    "unlocked": "unlocked",
    "setnx-expire": "SETNX then EXPIRE",
    "getset": "SETNX + GETSET timestamp",
    "plain-del": "SET NX PX + plain DEL",
    "get-del": "SET NX PX + GET then DEL",
    "redlease": "redlease",
    "redlock": "redlock (3 servers)",
}

FLAWS = {
    "unlocked": "nothing stops two workers reading the same idle number",
    "setnx-expire": "a crash between SETNX and EXPIRE leaves a lock that never expires; "
    "released by plain DEL too",
    "getset": "trusts every client's wall clock; no owner, a late GETSET moves the expiry",
    "plain-del": "a holder whose lease ran out deletes the next holder's lock",
    "get-del": "the lock can pass to another holder between the GET and the DEL",
    "redlease": "one script takes the lock and the fence; owner-checked release",
    "redlock": "a majority of independent servers must grant it within the lease",
}


# --------------------------------------------------------------------------- the table


_SCHEMA = """
CREATE TABLE numbers (
    id     INTEGER PRIMARY KEY,
    number TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'idle',   -- 'idle' or 'busy'
    holder INTEGER,                        -- the worker it was handed to
    fence  INTEGER                         -- the fencing token of that hand-out
);
CREATE TABLE pool (max_fence INTEGER NOT NULL);   -- highest fence that touched the pool
CREATE TABLE claims (number_id INTEGER NOT NULL, worker INTEGER NOT NULL, fence INTEGER);
CREATE TABLE rejected (number_id INTEGER, worker INTEGER NOT NULL, fence INTEGER NOT NULL);
"""


def _connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=60.0, isolation_level=None)
    db.execute("PRAGMA busy_timeout = 60000")
    db.execute("PRAGMA synchronous = NORMAL")
    return db


def create_table(path: str, numbers: int, seed: int) -> None:
    """A fresh pool of ``numbers`` idle phone numbers (distinct, seeded)."""
    rng = random.Random(seed)
    picked = rng.sample(range(10_000_000, 100_000_000), numbers)
    db = _connect(path)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.executescript(_SCHEMA)
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO numbers (id, number) VALUES (?, ?)",
            [(i + 1, f"+1 555 {n:08d}") for i, n in enumerate(picked)],
        )
        db.execute("INSERT INTO pool (max_fence) VALUES (0)")
        db.execute("COMMIT")
    finally:
        db.close()


@dataclass(frozen=True)
class TableOutcome:
    claims: int
    handed_out_twice: int
    rejected: int
    idle_left: int


def read_outcome(path: str) -> TableOutcome:
    db = _connect(path)
    try:
        claims = db.execute("SELECT COUNT(*) FROM claims").fetchone()[0]
        twice = db.execute(
            "SELECT COUNT(*) FROM (SELECT number_id FROM claims "
            "GROUP BY number_id HAVING COUNT(*) > 1)"
        ).fetchone()[0]
        rejected = db.execute("SELECT COUNT(*) FROM rejected").fetchone()[0]
        idle = db.execute("SELECT COUNT(*) FROM numbers WHERE status = 'idle'").fetchone()[0]
    finally:
        db.close()
    return TableOutcome(int(claims), int(twice), int(rejected), int(idle))


# Outcomes of one critical section.
CLAIMED, NONE_LEFT, REJECTED = "claimed", "none left", "rejected"


def claim_number(
    db: sqlite3.Connection,
    worker: int,
    fence: int | None,
    *,
    fenced: bool,
    window: float,
    pause: float = 0.0,
) -> str:
    """The critical section: read the first idle number, wait (the race window, plus an
    injected pause), then mark it busy for ``worker`` and record the hand-out.

    With ``fenced`` the pool records the highest fence on the read and refuses the write
    of any holder older than the latest one that has read it.
    """
    if fenced:
        if fence is None:
            raise ValueError("a fenced claim needs a fencing token")
        db.execute("BEGIN IMMEDIATE")
        try:
            newest = db.execute(
                "UPDATE pool SET max_fence = ? WHERE max_fence < ?", (fence, fence)
            ).rowcount
            row = db.execute(
                "SELECT id FROM numbers WHERE status = 'idle' ORDER BY id LIMIT 1"
            ).fetchone()
            if not newest:
                db.execute(
                    "INSERT INTO rejected (number_id, worker, fence) VALUES (NULL, ?, ?)",
                    (worker, fence),
                )
        finally:
            db.execute("COMMIT")
        if not newest:
            return REJECTED
    else:
        row = db.execute(
            "SELECT id FROM numbers WHERE status = 'idle' ORDER BY id LIMIT 1"
        ).fetchone()
    if row is None:
        return NONE_LEFT
    number_id = int(row[0])
    time.sleep(window + pause)
    db.execute("BEGIN IMMEDIATE")
    try:
        if fenced:
            written = db.execute(
                "UPDATE numbers SET status = 'busy', holder = ?, fence = ? "
                "WHERE id = ? AND ? >= (SELECT max_fence FROM pool)",
                (worker, fence, number_id, fence),
            ).rowcount
        else:
            written = db.execute(
                "UPDATE numbers SET status = 'busy', holder = ?, fence = ? WHERE id = ?",
                (worker, fence, number_id),
            ).rowcount
        if written:
            db.execute(
                "INSERT INTO claims (number_id, worker, fence) VALUES (?, ?, ?)",
                (number_id, worker, fence),
            )
        else:
            db.execute(
                "INSERT INTO rejected (number_id, worker, fence) VALUES (?, ?, ?)",
                (number_id, worker, fence),
            )
    finally:
        db.execute("COMMIT")
    return CLAIMED if written else REJECTED


_PG_SCHEMA = (
    "DROP TABLE IF EXISTS numbers, claims, rejected, redlease_fences",
    "CREATE TABLE numbers (id INT PRIMARY KEY, number TEXT NOT NULL, "
    "status TEXT NOT NULL DEFAULT 'idle', holder INT, fence BIGINT)",
    "CREATE TABLE claims (number_id INT NOT NULL, worker INT NOT NULL, fence BIGINT)",
    "CREATE TABLE rejected (number_id INT, worker INT NOT NULL, fence BIGINT NOT NULL)",
)
GATED = "numbers"  # the resource the gate guards: the pool of numbers


def create_pg_table(dsn: str, numbers: int, seed: int) -> None:
    """The same fresh pool in PostgreSQL, with the fence gate's table."""
    import psycopg

    from .. import sql

    rng = random.Random(seed)
    picked = rng.sample(range(10_000_000, 100_000_000), numbers)
    with psycopg.connect(dsn) as db:
        for statement in _PG_SCHEMA:
            db.execute(statement)
        sql.create_table(db)
        with db.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO numbers (id, number) VALUES (%s, %s)",
                [(i + 1, f"+1 555 {n:08d}") for i, n in enumerate(picked)],
            )


def read_pg_outcome(dsn: str) -> TableOutcome:
    import psycopg

    with psycopg.connect(dsn) as db:
        counts = [
            int((db.execute(query).fetchone() or (0,))[0])
            for query in (
                "SELECT COUNT(*) FROM claims",
                "SELECT COUNT(*) FROM (SELECT number_id FROM claims "
                "GROUP BY number_id HAVING COUNT(*) > 1) twice",
                "SELECT COUNT(*) FROM rejected",
                "SELECT COUNT(*) FROM numbers WHERE status = 'idle'",
            )
        ]
    return TableOutcome(*counts)


def claim_number_gated(
    db: Any, worker: int, fence: int, *, window: float, pause: float = 0.0
) -> str:
    """The critical section on PostgreSQL through redlease's fence gate: the read and the
    write are each a transaction that passes the gate first, so a holder whose fence is
    older than the newest that has passed writes nothing. The write itself is the plain,
    unconditional ``UPDATE``: the gate alone refuses the late writer."""
    from .. import sql
    from .._base.errors import StaleFence

    number_id: int | None = None
    try:
        sql.fence_gate(db, GATED, fence)
        row = db.execute(
            "SELECT id FROM numbers WHERE status = 'idle' ORDER BY id LIMIT 1"
        ).fetchone()
        db.commit()
        if row is None:
            return NONE_LEFT
        number_id = int(row[0])
        time.sleep(window + pause)
        sql.fence_gate(db, GATED, fence)
        db.execute(
            "UPDATE numbers SET status = 'busy', holder = %s, fence = %s WHERE id = %s",
            (worker, fence, number_id),
        )
        db.execute(
            "INSERT INTO claims (number_id, worker, fence) VALUES (%s, %s, %s)",
            (number_id, worker, fence),
        )
        db.commit()
    except StaleFence:
        db.rollback()
        db.execute(
            "INSERT INTO rejected (number_id, worker, fence) VALUES (%s, %s, %s)",
            (number_id, worker, fence),
        )
        db.commit()
        return REJECTED
    except BaseException:
        db.rollback()
        raise
    return CLAIMED


# --------------------------------------------------------------------------- the locks


class _RedlockContender(broken.RedleaseContender):
    """``redlease.Redlock`` behind the ``broken.Contender`` surface (acquire and release
    as redlease's own contender's)."""

    label = "redlock"

    def __init__(self, clients: Sequence[Any], name: str, ttl: float) -> None:
        from .. import Redlock

        self.lock: Any = Redlock(list(clients), name, ttl=ttl)
        self.lost_on_release = 0


def make_contender(mode: str, clients: Sequence[Any], name: str, ttl: float) -> Any:
    if mode == "unlocked":
        return broken.NoLock()
    if mode == "redlock":
        return _RedlockContender(clients, name, ttl)
    if mode in broken.CONTENDERS:
        return broken.CONTENDERS[mode](clients[0], name, ttl)
    raise ValueError(f"unknown mode {mode!r}")


def effective_lease(mode: str, ttl: float) -> float:
    """How long the lock really lasts: SETNX-then-EXPIRE can only expire in whole seconds."""
    if mode == "setnx-expire":
        return float(max(1, math.ceil(ttl)))
    return ttl


def redlock_status(urls: Sequence[str]) -> str | None:
    """None when ``redlease.Redlock`` works on these servers, else why it does not."""
    from .. import Redlock

    clients = [from_url(url) for url in urls]
    try:
        lock: Any = Redlock(clients, f"redlease-demo:probe:{secrets.token_hex(4)}", ttl=2.0)
        lease = lock.try_acquire()
        if lease is None:
            return "the probe lock was busy"
        lease.release()
    except Exception as exc:
        return f"failed: {type(exc).__name__}: {exc}"
    finally:
        for client in clients:
            client.close()
    return None


# --------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class RunSpec:
    """Everything one mode's worker processes need (picklable for "spawn")."""

    mode: str
    urls: tuple[str, ...]
    lock_name: str
    db_path: str
    db_url: str = ""  # a PostgreSQL DSN: the table lives there, claims pass the SQL gate
    workers: int = 6
    ttl: float = 0.5
    fenced: bool = False
    window: float = 0.004  # between the read and the write: where races happen
    dial: float = 0.01  # "dialling", outside the lock
    budget: float = 10.0  # seconds of work at most
    acquire_timeout: float = 5.0
    pause: float = 0.0  # injected pause inside the critical section (0: none)
    # Which critical sections pause their holder, counted from 1 over all workers: a
    # given worker's turn may never come (Redlock's waiting is not fair), the n-th
    # section overall always does, and always finds an idle number to claim.
    pause_sections: tuple[int, ...] = ()
    seed: int = 0


@dataclass
class WorkerStats:
    sections: int = 0
    claimed: int = 0
    rejected: int = 0
    timeouts: int = 0
    lost_on_release: int = 0
    pauses: int = 0
    error: str | None = None


def _worker(
    spec: RunSpec, index: int, ready: Any, go: Any, claimed: Any, begun: Any, out: Any
) -> None:
    stats = WorkerStats()
    clients: list[Any] = []
    db: Any = None  # sqlite3's, or psycopg's for the gated run
    # The demo's table reports the leases its paused holders lose; the library's log line
    # for each, and its warning that a server keeps nothing on disk (said once already by
    # the parent's probe, or not at all for the demo's throwaway servers), would only
    # repeat that in the middle of the table.
    logging.getLogger("redlease").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*keeps nothing on disk")
    try:
        clients = [from_url(url) for url in spec.urls]
        contender = make_contender(spec.mode, clients, spec.lock_name, spec.ttl)
        if spec.db_url:
            import psycopg

            db = psycopg.connect(spec.db_url)
        else:
            db = _connect(spec.db_path)
        rng = random.Random(spec.seed * 1000 + index)
        ready.put(index)
        if not go.wait(timeout=120):
            return
        deadline = time.monotonic() + spec.budget
        while time.monotonic() < deadline:
            left = deadline - time.monotonic()
            held = contender.acquire(max(0.0, min(spec.acquire_timeout, left)))
            if held is None:
                stats.timeouts += 1
                continue
            stats.sections += 1
            with begun.get_lock():
                begun.value += 1
                pause = spec.pause if begun.value in spec.pause_sections else 0.0
            try:
                if spec.db_url:
                    outcome = claim_number_gated(
                        db, index, held.fence, window=spec.window, pause=pause
                    )
                else:
                    outcome = claim_number(
                        db, index, held.fence, fenced=spec.fenced, window=spec.window, pause=pause
                    )
            finally:
                held.release()
            if outcome == NONE_LEFT:
                break
            if pause:
                stats.pauses += 1
            if outcome == CLAIMED:
                stats.claimed += 1
                with claimed.get_lock():
                    claimed.value += 1
            else:
                stats.rejected += 1
            time.sleep(spec.dial * rng.uniform(0.5, 1.5))
        stats.lost_on_release = int(getattr(contender, "lost_on_release", 0))
    except Exception as exc:
        stats.error = f"{type(exc).__name__}: {exc}"
    finally:
        out.put((index, stats))
        if db is not None:
            db.close()
        for client in clients:
            client.close()


@dataclass
class ModeResult:
    mode: str
    fenced: bool = False
    paused: bool = False
    gate: bool = False  # the table on PostgreSQL, behind redlease's SQL fence gate
    claims: int = 0
    handed_out_twice: int = 0
    rejected: int = 0
    elapsed: float = 0.0
    idle_left: int = 0
    timeouts: int = 0
    lost_on_release: int = 0
    pauses: int = 0
    keys_without_ttl: int = 0
    skipped: str | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        text = LABELS.get(self.mode, self.mode)
        if self.gate:
            return text + " + fence gate (PostgreSQL)"
        if self.mode in FENCED_MODES and self.paused:
            text += " + fence" if self.fenced else ", no fence"
        return text

    @property
    def throughput(self) -> float:
        return self.claims / self.elapsed if self.elapsed > 0 else 0.0

    def notes(self) -> str:
        if self.skipped:
            return self.skipped
        parts = []
        if self.errors:
            parts.append(f"worker error: {self.errors[0]}")
        if self.pauses:
            parts.append(f"{self.pauses} pause{'s' if self.pauses != 1 else ''}")
        if self.lost_on_release:
            n = self.lost_on_release
            parts.append(f"{n} release{'s' if n != 1 else ''} found the lease lost")
        if self.timeouts:
            parts.append(f"{self.timeouts} acquire timeouts")
        if self.keys_without_ttl:
            parts.append("lock key left without TTL")
        if self.idle_left and not self.errors:
            parts.append(f"{self.idle_left} numbers left idle (time budget)")
        return "; ".join(parts)


def _count_keys_without_ttl(urls: Sequence[str], pattern: str) -> int:
    found = 0
    for url in urls:
        client = from_url(url)
        try:
            for key in client.scan_iter(match=pattern, count=1000):
                if client.pttl(key) == -1:
                    found += 1
        finally:
            client.close()
    return found


def _delete_keys(urls: Sequence[str], pattern: str) -> None:
    for url in urls:
        client = from_url(url)
        try:
            keys = list(client.scan_iter(match=pattern, count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


Progress = Callable[[int, float, bool], None]


def run_mode(spec: RunSpec, numbers: int, progress: Progress | None = None) -> ModeResult:
    """Run one mode on a fresh table with ``spec.workers`` fresh processes."""
    if spec.db_url:
        create_pg_table(spec.db_url, numbers, spec.seed)
    else:
        create_table(spec.db_path, numbers, spec.seed)
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    go = ctx.Event()
    claimed, begun = ctx.Value("i", 0), ctx.Value("i", 0)  # numbers claimed, sections begun
    procs = [
        ctx.Process(target=_worker, args=(spec, i, ready, go, claimed, begun, out), daemon=True)
        for i in range(spec.workers)
    ]
    result = ModeResult(
        spec.mode, fenced=spec.fenced, paused=bool(spec.pause_sections), gate=bool(spec.db_url)
    )
    stats: dict[int, WorkerStats] = {}
    try:
        if progress is not None:
            progress(0, 0.0, False)
        with _children_ignore_sigint():
            for proc in procs:
                proc.start()
        _await_ready(ready, out, procs, stats)
        started = time.monotonic()
        go.set()
        hard_stop = started + spec.budget + spec.acquire_timeout + spec.pause + 30.0
        while len(stats) < len(procs):
            try:
                index, worker_stats = out.get(timeout=0.1)
                stats[index] = worker_stats
            except queue.Empty:
                if time.monotonic() > hard_stop or not any(p.is_alive() for p in procs):
                    if not out.empty():
                        continue
                    break
            if progress is not None:
                progress(claimed.value, time.monotonic() - started, False)
        result.elapsed = time.monotonic() - started
        if progress is not None:
            progress(claimed.value, result.elapsed, True)
    finally:
        go.set()
        # All reported: they are exiting. Interrupted or failed: stop them now.
        _stop(procs, grace=5.0 if len(stats) == len(procs) else 0.0)
        ready.close()
        out.close()
    missing = len(procs) - len(stats)
    if missing:
        result.errors.append(f"{missing} worker(s) did not report")
    for s in stats.values():
        result.timeouts += s.timeouts
        result.lost_on_release += s.lost_on_release
        result.pauses += s.pauses
        if s.error:
            result.errors.append(s.error)
    outcome = read_pg_outcome(spec.db_url) if spec.db_url else read_outcome(spec.db_path)
    result.claims = outcome.claims
    result.handed_out_twice = outcome.handed_out_twice
    result.rejected = outcome.rejected
    result.idle_left = outcome.idle_left
    if spec.mode != "unlocked":
        result.keys_without_ttl = _count_keys_without_ttl(spec.urls, f"*{spec.lock_name}*")
    return result


@contextlib.contextmanager
def _children_ignore_sigint() -> Iterator[None]:
    """Workers start with Ctrl-C ignored (the disposition survives exec), so a Ctrl-C
    reaches only this process, which then stops them and the servers in order."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _await_ready(ready: Any, out: Any, procs: Sequence[Any], stats: dict[int, WorkerStats]) -> None:
    waiting = set(range(len(procs)))
    deadline = time.monotonic() + 120.0
    while waiting:
        try:
            waiting.discard(ready.get(timeout=0.2))
        except queue.Empty:
            # A worker that failed to start reports its error instead of "ready".
            with contextlib.suppress(queue.Empty):
                while True:
                    index, worker_stats = out.get_nowait()
                    stats[index] = worker_stats
                    waiting.discard(index)
            if time.monotonic() > deadline:
                raise RuntimeError("worker processes did not start within 120 s") from None


def _stop(procs: Sequence[Any], grace: float) -> None:
    deadline = time.monotonic() + grace
    for proc in procs:
        if proc.pid is not None:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.pid is not None and proc.is_alive():
            proc.terminate()
    for proc in procs:
        if proc.pid is not None:
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)


# --------------------------------------------------------------------------- the whole demo


@dataclass
class DemoConfig:
    urls: Sequence[str] = ()  # empty: start private servers
    modes: Sequence[str] = ALL_MODES
    workers: int = 6
    numbers: int = 200
    ttl: float = 0.5
    seed: int = 1
    basic: bool = True  # part 1: no faults
    pauses: bool = True  # part 2: holder pauses past the lease, with and without fencing
    pause_factor: float = 1.5
    pause_sections: tuple[int, ...] = (2, 6)
    window: float = 0.004
    dial: float = 0.01
    budget: float = 10.0
    quick: bool = False
    # part 2 also runs redlease with the table on a private PostgreSQL behind the SQL fence
    # gate, where PostgreSQL and psycopg are installed (the postgres extra)
    postgres: bool = True

    @classmethod
    def quick_config(cls, **overrides: Any) -> DemoConfig:
        base = cls(
            workers=4,
            numbers=60,
            ttl=0.4,
            pause_sections=(2,),
            budget=6.0,
            quick=True,
            modes=("unlocked", "plain-del", "redlease", "redlock"),
        )
        return replace(base, **overrides)


@dataclass
class DemoReport:
    basic: list[ModeResult] = field(default_factory=list)
    paused: list[ModeResult] = field(default_factory=list)
    server: str = ""

    def all(self) -> list[ModeResult]:
        return [*self.basic, *self.paused]


def validate(config: DemoConfig) -> None:
    unknown = [m for m in config.modes if m not in ALL_MODES]
    if unknown:
        raise ValueError(
            f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(ALL_MODES)}"
        )
    if not config.modes:
        raise ValueError("modes: give at least one mode")
    if config.workers < 2:
        raise ValueError(f"workers must be at least 2, got {config.workers}")
    if config.numbers < 1:
        raise ValueError(f"numbers must be at least 1, got {config.numbers}")
    if not (math.isfinite(config.ttl) and 0.05 <= config.ttl <= 60):
        raise ValueError(f"ttl must be between 0.05 and 60 seconds, got {config.ttl}")


@contextlib.contextmanager
def _servers(config: DemoConfig, want: int, out: TextIO) -> Iterator[tuple[list[str], str]]:
    """The URLs to use: the user's, or ``want`` private servers started (and stopped) here."""
    if config.urls:
        for url in config.urls:
            client = from_url(url, socket_connect_timeout=5.0)
            try:
                client.ping()
            finally:
                client.close()
        yield list(config.urls), "the given server(s): " + ", ".join(config.urls)
        return
    from . import servers

    binary = servers.find_binary()
    with servers.running(want, kind=binary.kind) as procs, warnings.catch_warnings():
        # throwaway servers keep nothing on disk, on purpose: no need to warn of it
        warnings.filterwarnings("ignore", message=".*keeps nothing on disk")
        ports = ", ".join(str(p.port) for p in procs)
        where = f"private {binary.kind}-server {binary.version()} on 127.0.0.1 (port {ports})"
        yield [p.url for p in procs], where


class _ProgressLine:
    """One line per mode: redrawn in place on a terminal, printed once when done otherwise."""

    def __init__(self, out: TextIO, label: str, numbers: int, tty: bool) -> None:
        self.out, self.label, self.numbers, self.tty = out, label, numbers, tty
        self.last_draw = 0.0

    def __call__(self, claimed: int, elapsed: float, done: bool) -> None:
        now = time.monotonic()
        if not done and (not self.tty or now - self.last_draw < 0.1):
            return
        self.last_draw = now
        state = "done" if done else "running"
        text = f"  {self.label:<30} {claimed:>5} claims  {elapsed:5.1f} s  {state}"
        if self.tty:
            self.out.write("\r" + text.ljust(78) + ("\n" if done else ""))
        elif done:
            self.out.write(text + "\n")
        self.out.flush()


def postgres_missing() -> str | None:
    """Why the gated run cannot run here (None: it can)."""
    import importlib.util

    from .postgres import find_postgres

    if importlib.util.find_spec("psycopg") is None or find_postgres() is None:
        return "no PostgreSQL here (pip install 'redlease[postgres]')"
    return None


@contextlib.contextmanager
def _private_postgres() -> Iterator[Any]:
    from .postgres import PostgresProcess

    with PostgresProcess() as pg:
        yield pg


def run_demo(config: DemoConfig, out: TextIO | None = None) -> DemoReport:
    """Run the demo, print it to ``out`` (default stdout) and return the measurements."""
    out = out if out is not None else sys.stdout
    validate(config)
    tty = bool(getattr(out, "isatty", lambda: False)())
    report = DemoReport()
    run_id = secrets.token_hex(4)
    workdir = tempfile.mkdtemp(prefix="redlease-demo-")
    want_redlock = "redlock" in config.modes
    redlock_why: str | None = None
    try:
        servers_wanted = 3 if want_redlock and redlock_why is None else 1
        with (
            contextlib.ExitStack() as stack,
            _servers(config, servers_wanted, out) as (
                urls,
                where,
            ),
        ):
            report.server = where
            _intro(config, where, out)
            if want_redlock and redlock_why is None:
                if len(urls) < 3:
                    redlock_why = "needs 3 or more --redis URLs (independent servers)"
                else:
                    redlock_why = redlock_status(urls)
            runs = 0

            def one(mode: str, fenced: bool, paused: bool, dsn: str = "") -> ModeResult:
                nonlocal runs
                runs += 1
                if mode == "redlock" and redlock_why is not None:
                    return ModeResult(mode, fenced, paused, skipped=f"skipped: {redlock_why}")
                name = f"redlease-demo:{run_id}:{runs}:{mode}"
                lease = effective_lease(mode, config.ttl)
                pause = config.pause_factor * lease if paused else 0.0
                spec = RunSpec(
                    mode=mode,
                    urls=tuple(urls) if mode == "redlock" else (urls[0],),
                    lock_name=name,
                    db_path=os.path.join(workdir, f"numbers-{runs}.sqlite3"),
                    workers=config.workers,
                    ttl=config.ttl,
                    fenced=fenced,
                    window=config.window,
                    dial=config.dial,
                    budget=config.budget,
                    acquire_timeout=max(5.0, 2 * lease + pause),
                    pause=pause,
                    pause_sections=config.pause_sections if paused else (),
                    seed=config.seed,
                    db_url=dsn,
                )
                label = ModeResult(mode, fenced, paused, gate=bool(dsn)).label
                bar = _ProgressLine(out, label, config.numbers, tty)
                try:
                    return run_mode(spec, config.numbers, bar)
                finally:
                    _delete_keys(spec.urls, f"*{name}*")

            if config.basic:
                out.write("\n1. Nothing goes wrong: no pauses, no crashes\n")
                out.flush()
                for mode in config.modes:
                    report.basic.append(one(mode, False, False))
                _table(report.basic, out, fenced_column=False)
            locked = [m for m in config.modes if m != "unlocked"]
            if config.pauses and locked:
                text = (
                    f"The holder of {_sections(config)} (counted over all workers) sleeps "
                    f"{config.pause_factor:g} x its lease between the read and the write, as "
                    "a GC pause, swapping or SIGSTOP would. Without fencing, the next holder "
                    "reads the same idle number; with fencing, the table records the newest "
                    "fence on each read and refuses the late writer."
                )
                if config.postgres and "redlease" in locked:
                    text += (
                        " The fence gate run keeps the table on PostgreSQL, and the claim's "
                        "read and write each pass redlease.sql.fence_gate first."
                    )
                out.write("\n2. A holder pauses longer than its lease\n")
                out.write(_wrap(text, 92, "   ", hang="") + "\n")
                out.flush()
                for mode in locked:
                    report.paused.append(one(mode, False, True))
                    if mode in FENCED_MODES:
                        report.paused.append(one(mode, True, True))
                    if mode == "redlease" and config.postgres:
                        missing = postgres_missing()
                        if missing is not None:
                            skipped = f"skipped: {missing}"
                            report.paused.append(
                                ModeResult(mode, True, True, True, skipped=skipped)
                            )
                        else:
                            pg = stack.enter_context(_private_postgres())
                            report.paused.append(one(mode, True, True, dsn=pg.dsn))
                _table(report.paused, out, fenced_column=True)
            _legend(config, out)
            _conclusion(report, out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def _sections(config: DemoConfig) -> str:
    numbers = [str(n) for n in config.pause_sections]
    if len(numbers) == 1:
        return f"critical section {numbers[0]}"
    return f"critical sections {', '.join(numbers[:-1])} and {numbers[-1]}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _intro(config: DemoConfig, where: str, out: TextIO) -> None:
    text = (
        f"A call centre keeps {config.numbers} phone numbers in an SQLite table. To place a "
        "call, a worker reads the first idle number, marks it busy for itself and dials it. "
        f"{config.workers} worker processes do this at once. Between the read and the write "
        f"there is a {config.window * 1000:g} ms gap: a second worker that reads in that gap "
        'gets the same "idle" number, and two calls go out on one line. Each mode runs on a '
        "fresh table with fresh processes: no lock, the wrong locks the articles warn "
        "against, then redlease."
    )
    out.write("redlease demo: handing out idle phone numbers\n\n")
    out.write(_wrap(text, 92, "") + "\n")
    out.write(_wrap(f"Lock lease (ttl): {config.ttl:g} s. Server: {where}.", 92, "") + "\n")
    out.flush()


def _table(results: Sequence[ModeResult], out: TextIO, *, fenced_column: bool) -> None:
    """The results as aligned columns under a header rule; each row's notes (pauses,
    timeouts, a skipped mode's reason...) follow the table, for the rows that have any."""
    headers = ["claims", "handed out twice"]
    if fenced_column:
        headers.append("stale writes rejected")
    headers.append("claims/s")
    rows: list[tuple[str, list[str]]] = []
    for r in results:
        if r.skipped:
            cells = ["-"] * len(headers)
        else:
            cells = [str(r.claims), str(r.handed_out_twice)]
            if fenced_column:
                cells.append(str(r.rejected) if r.fenced else "-")
            cells.append(f"{r.throughput:.0f}")
        rows.append((r.label, cells))
    first = max([len("mode"), *(len(label) for label, _ in rows)])
    widths = [max([len(h), *(len(cells[i]) for _, cells in rows)]) for i, h in enumerate(headers)]

    def line(label: str, cells: Sequence[str]) -> str:
        parts = [label.ljust(first), *(c.rjust(w) for c, w in zip(cells, widths, strict=True))]
        return ("  " + "  ".join(parts)).rstrip()

    lines = ["", line("mode", headers), line("-" * first, ["-" * w for w in widths])]
    lines += [line(label, cells) for label, cells in rows]
    notes = [(r.label, r.notes()) for r in results if r.notes()]
    if notes:
        lines += ["", "  Notes:"]
        lines += [_wrap(f"{label}: {note}", 92, "    ") for label, note in notes]
    out.write("\n".join(lines) + "\n")
    out.flush()


def _legend(config: DemoConfig, out: TextIO) -> None:
    out.write("\nWhat each lock does wrong (or right):\n")
    for mode in config.modes:
        out.write(f"  {LABELS[mode]:<26} {FLAWS[mode]}\n")
    out.flush()


def _conclusion(report: DemoReport, out: TextIO) -> None:
    lines = []
    ran = [r for r in report.basic if not r.skipped]
    if ran:
        parts = [f"{r.label}: {r.handed_out_twice}" for r in ran]
        lines.append("Numbers handed out twice with nothing going wrong: " + ", ".join(parts) + ".")
    unfenced = [r for r in report.paused if not r.skipped and not r.fenced]
    fenced = [r for r in report.paused if not r.skipped and r.fenced]
    if unfenced:
        parts = [f"{r.label}: {r.handed_out_twice}" for r in unfenced]
        lines.append(
            "With a holder paused past its lease, every lock lets a second worker in "
            "(handed out twice: " + ", ".join(parts) + ")."
        )
    if fenced:
        parts = [
            f"{r.label}: {r.handed_out_twice} handed out twice, "
            f"{_plural(r.rejected, 'stale write')} rejected"
            for r in fenced
        ]
        lines.append("Fencing makes the table refuse the late writer: " + "; ".join(parts) + ".")
    if lines:
        out.write("\nConclusion\n")
        for line in lines:
            out.write(_wrap(line, 92, "  ") + "\n")
    out.flush()


def _wrap(text: str, width: int, indent: str, hang: str = "  ") -> str:
    import textwrap

    follow = indent + hang if indent else ""
    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=follow)
