"""The fault scenarios (the safety report's rows), the nemesis that injects their faults
on a seeded schedule, and the runner that starts servers, proxies and worker processes
and hands the records to the checker.

Everything runs on 127.0.0.1; every process and proxy started here is stopped in a
``finally``. Faults that must produce a violation are made deterministic (a pause longer
than the ttl at a chosen section), never left to a race.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from .. import servers
from . import resource
from .checker import Outcome, Record, check
from .proxy import FaultProxy

SAFE, VIOLATION, POSSIBLE = "safe", "violation expected", "violation possible"

Event = tuple[float, str, tuple[Any, ...]]


@dataclass
class Plan:
    """What one run does: the deployment, the workers and the faults."""

    contender: str = "redlease"
    nodes: int = 1
    aof: bool = False
    proxies: bool = False
    processes: int = 3
    ttl: float = 1.0
    duration: float = 3.0
    work: float = 0.002
    timeout: float = 3.0
    socket_timeout: float = 1.0
    pauses: list[dict[str, Any]] = field(default_factory=list)  # worker-side, deterministic
    stop_seconds: float = 0.0  # how long a worker that SIGSTOPs itself stays stopped
    events: list[Event] = field(default_factory=list)  # nemesis: (offset s, action, args)
    auto_renew: bool = False
    faketime: bool = False  # the workers run under libfaketime ("clock" events step them)
    server_faketime: bool = False  # the lock servers do instead
    between: str | None = None  # broken locks: "kill" or seconds to sleep in the window
    options: dict[str, Any] = field(default_factory=dict)
    think: float = 0.0  # idle time after every second section
    # worker -> its own proxy in front of each node, delayed by this many ms (0: no delay)
    paths: dict[int, list[float]] = field(default_factory=dict)
    to_validity: list[int] = field(default_factory=list)  # workers that use all their validity
    audit: bool = False  # after each release, look on every node for the released token
    replica: bool = False  # each lock node gets an asynchronous replica (failover)
    server_args: list[str] = field(default_factory=list)  # for every lock server
    forks: list[int] = field(default_factory=list)  # sections in which a worker forks
    # worker -> the attempt during which it kills itself (SIGKILL) while queued
    die_waiting: dict[int, int] = field(default_factory=dict)
    # row 19: "election", "multilock", "semaphore:<limit>", "readwrite" ("": the lock)
    primitive: str = ""
    # rows 20: the workers also write through the fence gates (a PostgreSQL server is
    # started beside the resource server)
    gates: bool = False


@dataclass(frozen=True)
class Scenario:
    row: int  # the table's row
    fault: str
    expected_unfenced: str
    expected_fenced: str
    needs: str | None  # "redlock", "auto_renew", "faketime", "server_faketime" or None
    plan: Callable[[random.Random, bool], Plan]
    label: str = ""  # how the row is numbered in the report, when not just ``row``
    available: bool = False  # no operation may fail (the faults heal within a retry)
    max_gap: float | None = None  # the lock may stand idle at most this long (seconds)

    @property
    def number(self) -> str:
        return self.label or str(self.row)


def _holder_pause(kind: str) -> Callable[[random.Random, bool], Plan]:
    def plan(rng: random.Random, quick: bool) -> Plan:
        p = Plan(ttl=0.5, duration=3.0 if quick else 8.0, processes=3)
        for k in range(1 if quick else 3):
            worker = rng.randrange(p.processes)
            p.pauses.append(
                {
                    "worker": worker,
                    "section": 2 + 3 * k + rng.randrange(2),
                    "kind": kind,
                    "seconds": p.ttl * 2.5,
                }
            )
        p.stop_seconds = p.ttl * 2.5
        return p

    return plan


def _acquisition_delays(rng: random.Random, quick: bool) -> Plan:
    p = Plan(proxies=True, ttl=1.0, duration=4.0 if quick else 10.0, socket_timeout=2.0)
    t = 0.5
    while t < p.duration - 1.0:
        delay = rng.choice([30, 80, 150])
        p.events += [(t, "proxy", (0, "delay", delay)), (t + 0.5, "proxy", (0, "pass", 0))]
        p.events += [(t + 0.7, "pause", (0,)), (t + 0.9, "resume", (0,)), (t + 0.9, "heal", ())]
        t += 1.5 + rng.random()
    return p


def _node_crash(aof: bool, restart_after: float) -> Callable[[random.Random, bool], Plan]:
    def plan(rng: random.Random, quick: bool) -> Plan:
        p = Plan(contender="redlock", nodes=3, aof=aof, ttl=1.0, work=0.01)
        p.duration = 4.0 if quick else 10.0
        t = 0.8
        while t < p.duration - restart_after - 0.5:
            node = rng.randrange(p.nodes)
            p.events += [(t, "kill", (node,)), (t + restart_after, "restart", (node,))]
            p.events.append((t + restart_after, "heal", ()))
            t += restart_after + 1.0 + rng.random()
        return p

    return plan


def _early_expiry(rng: random.Random, quick: bool) -> Plan:
    p = Plan(contender="redlock", nodes=3, ttl=1.0, work=0.05, duration=4.0 if quick else 10.0)
    t = 0.6
    while t < p.duration - 0.3:
        p.events.append((t, "pexpire", (rng.randrange(p.nodes),)))
        t += 0.3 + rng.random() * 0.3
    return p


def _clock_step(rng: random.Random, quick: bool) -> Plan:
    p = Plan(faketime=True, ttl=1.0, duration=4.0 if quick else 8.0)
    p.events += [(1.0, "clock", (rng.choice([-1, 1]) * 3600,)), (2.5, "clock", (0,))]
    return p


def _lost_replies(rng: random.Random, quick: bool) -> Plan:
    p = Plan(proxies=True, ttl=1.0, duration=5.0 if quick else 10.0, socket_timeout=0.3)
    t = 0.6
    while t < p.duration - 2.0:
        p.events += [(t, "proxy", (0, "drop_replies", 0)), (t + 0.4, "proxy", (0, "pass", 0))]
        p.events.append((t + 0.4, "heal", ()))
        t += 1.5 + rng.random()
    return p


def _nodes_down(count: int) -> Callable[[random.Random, bool], Plan]:
    def plan(rng: random.Random, quick: bool) -> Plan:
        p = Plan(contender="redlock", nodes=5, proxies=True, ttl=1.0, socket_timeout=0.3)
        p.duration = 4.0 if quick else 8.0
        down = rng.sample(range(p.nodes), count)
        for node in down:
            p.events.append((1.0, "proxy", (node, rng.choice(["blackhole", "reset"]), 0)))
            p.events.append((p.duration - 1.0, "proxy", (node, "pass", 0)))
        p.events.append((p.duration - 1.0, "heal", ()))
        return p

    return plan


def _renewal_stall(rng: random.Random, quick: bool) -> Plan:
    p = Plan(auto_renew=True, ttl=1.0, work=1.5, duration=4.0 if quick else 8.0)
    p.events += [(1.2, "pause", (0,)), (2.6, "resume", (0,)), (2.6, "heal", ())]
    return p


def _dropped_connections(rng: random.Random, quick: bool) -> Plan:
    # The server closes clients idle for 1 s, and the workers idle for longer between
    # some sections; meanwhile every client connection is killed now and then, and the
    # server restarted (its data kept by the AOF).
    p = Plan(ttl=1.0, duration=5.0 if quick else 10.0, think=1.3, aof=True, work=0.01)
    p.server_args = ["--timeout", "1"]
    t = 0.7 + rng.random() * 0.3
    while t < p.duration - 1.0:
        if rng.random() < 0.5:
            p.events.append((t, "client_kill", (0,)))
        else:
            p.events += [(t, "kill", (0,)), (t + 0.05, "restart", (0,))]
        p.events.append((t + 0.05, "heal", ()))
        t += 0.8 + rng.random()
    return p


def _fork_in_section(rng: random.Random, quick: bool) -> Plan:
    # A holder forks in the middle of some sections; the child leaves the lease's `with`
    # block by sys.exit. Were the parent's lock released by it, another worker would get
    # in while the parent is still at work: an overlap and a lost update.
    p = Plan(ttl=2.0, work=0.2, duration=3.0 if quick else 6.0)
    p.forks = sorted(rng.sample(range(1, 8), 3))
    return p


def _queued_waiter_killed(rng: random.Random, quick: bool) -> Plan:
    # A long ttl (10 s): a dead waiter that were granted the lock, or rung, would hold
    # up the line for that long. One worker kills itself (SIGKILL) while queued, early in
    # the run, and the others go on; the lock must never stand idle for long.
    p = Plan(ttl=10.0, work=0.1, duration=4.0 if quick else 8.0, processes=3, timeout=20.0)
    p.die_waiting = {rng.randrange(p.processes): 2 + rng.randrange(3)}
    return p


def _data_loss(rng: random.Random, quick: bool) -> Plan:
    # One server loses its data three ways in a run: FLUSHALL, a kill -9 and restart
    # without persistence, and a failover to a replica cut off before the last grants
    # (the promoted replica holds an older fence counter). Sections of 0.3 s: a holder is
    # often mid-section when its key vanishes, and a newcomer gets in beside it.
    p = Plan(proxies=True, replica=True, ttl=1.0, work=0.3, duration=6.0 if quick else 10.0)
    p.options = {"fair": False}  # (see _failover)
    t = 0.8 + rng.random() * 0.3
    p.events += [(t, "flushall", (0,)), (t, "heal", ())]
    t += 1.2 + rng.random() * 0.3
    p.events += [(t, "kill", (0,)), (t + 0.05, "restart", (0,)), (t + 0.05, "heal", ())]
    t += 1.2 + rng.random() * 0.3
    p.events += [(t, "cut_replication", (0,)), (t + 0.65, "failover", (0,))]
    p.events += [(t + 0.65, "heal", ()), (t + 1.15, "rejoin", (0,))]
    return p


def _server_clock_back(rng: random.Random, quick: bool) -> Plan:
    # The assumption under the fences: the server's clock does not step back. Here it
    # steps back an hour and the server loses its data at the same moment, so the fence
    # counter starts again from the stepped clock: below the fences handed out before.
    p = Plan(server_faketime=True, ttl=1.0, work=0.05, duration=3.0 if quick else 6.0)
    t = 1.0 + rng.random() * 0.3
    p.events += [(t, "clock", (-3600,)), (t, "flushall", (0,)), (t, "heal", ())]
    return p


def _failover(replicas: int) -> Callable[[random.Random, bool], Plan]:
    def plan(rng: random.Random, quick: bool) -> Plan:
        # Sections of 0.6 s (ttl 1 s), and replication cut 0.65 s before the master dies:
        # at the failover someone holds a grant the replica never heard of, while the
        # key the replica has (an earlier holder's) expires before that section ends.
        # The address then moves to the promoted replica (the proxy), and the old master
        # comes back, empty, as the new master's replica. Not fair: a fair queue's stale
        # entries would hold newcomers off long enough to hide the loss.
        p = Plan(proxies=True, replica=True, ttl=1.0, work=0.6, duration=5.0 if quick else 8.0)
        p.options = {"fair": False}
        if replicas:
            p.options.update(replicas=replicas, replica_timeout=0.1)
        t = 1.0 + rng.random() * 0.5
        p.events += [(t, "cut_replication", (0,)), (t + 0.65, "failover", (0,))]
        p.events += [(t + 0.65, "heal", ()), (t + 1.15, "rejoin", (0,))]
        if replicas:  # no grant counts until a replica is back: that is the heal
            p.events.append((t + 1.15, "heal", ()))
        return p

    return plan


def _primitive(primitive: str, fault: str) -> Callable[[random.Random, bool], Plan]:
    """Row 19: a primitive's workload under row 1's fault (a holder paused past its
    lease), row 4's for one server (kill -9 and restart without persistence) or row
    10's (the server out of reach through the proxy for a while)."""

    def plan(rng: random.Random, quick: bool) -> Plan:
        if fault == "pause":
            p = _holder_pause("sigstop")(rng, quick)
        elif fault == "crash":
            p = Plan(ttl=1.0, work=0.05, duration=4.0 if quick else 8.0)
            t = 0.8
            while t < p.duration - 0.8:
                p.events += [(t, "kill", (0,)), (t + 0.05, "restart", (0,)), (t + 0.05, "heal", ())]
                t += 1.0 + rng.random()
        else:
            p = Plan(proxies=True, ttl=1.0, socket_timeout=0.3, duration=4.0 if quick else 8.0)
            p.events.append((1.0, "proxy", (0, rng.choice(["blackhole", "reset"]), 0)))
            p.events += [(2.0, "proxy", (0, "pass", 0)), (2.0, "heal", ())]
        p.primitive = primitive
        if primitive.startswith("semaphore:"):
            p.processes = int(primitive.split(":")[1]) + 2  # more than the limit
        return p

    return plan


_PRIMITIVES = (
    ("a", "election", "an election (leader's term as fence)"),
    ("b", "multilock", "a multi-lock of two names, listed in either order"),
    ("c", "semaphore:2", "a semaphore of limit 2 (its invariant: at most 2 holders)"),
    ("d", "readwrite", "a read/write lock, one section in three a write"),
)
_FAULTS = (
    ("1", "pause", "holder paused (SIGSTOP) past its lease", VIOLATION, SAFE),
    ("4", "crash", "server kill -9 + restart, no persistence", POSSIBLE, SAFE),
    ("10", "partition", "server out of reach through the proxy for 1 s", SAFE, SAFE),
)
ROW_19 = [
    Scenario(
        19,
        f"{what}: {fault_text}",
        unfenced,
        fenced,
        None,
        _primitive(primitive, fault),
        label=f"19{letter}{row}",
    )
    for letter, primitive, what in _PRIMITIVES
    for row, fault, fault_text, unfenced, fenced in _FAULTS
]


def _gated(base: Callable[[random.Random, bool], Plan]) -> Callable[[random.Random, bool], Plan]:
    """Rows 20: a row's plan, with the workers also writing through the fence gates."""

    def plan(rng: random.Random, quick: bool) -> Plan:
        p = base(rng, quick)
        p.gates = True
        return p

    return plan


ROW_20 = [
    Scenario(
        20,
        "fence gates (PostgreSQL, a second Redis): holder paused (SIGSTOP) past its lease",
        VIOLATION,
        SAFE,
        None,
        _gated(_holder_pause("sigstop")),
        label="20a",
    ),
    Scenario(
        20,
        "fence gates: the lock's server killed -9 and restarted empty",
        POSSIBLE,
        SAFE,
        None,
        _gated(_primitive("", "crash")),
        label="20b",
    ),
    Scenario(
        20,
        "fence gates: a Redlock node killed -9 and restarted empty",
        POSSIBLE,
        SAFE,
        "redlock",
        _gated(_node_crash(False, 0.05)),
        label="20c",
    ),
]


# Keyed by the row's number in the table ("13b" for the second row 13), in table order.
SCENARIOS: dict[str, Scenario] = {
    s.number: s
    for s in [
        Scenario(
            1,
            "holder pauses (SIGSTOP) longer than its validity",
            VIOLATION,
            SAFE,
            None,
            _holder_pause("sigstop"),
        ),
        Scenario(2, "pause or delay during acquisition", SAFE, SAFE, None, _acquisition_delays),
        Scenario(
            3,
            "holder's write delayed past lease expiry",
            VIOLATION,
            SAFE,
            None,
            _holder_pause("sleep"),
        ),
        Scenario(
            4,
            "Redlock node kill -9 + immediate restart, no persistence",
            POSSIBLE,
            SAFE,
            "redlock",
            _node_crash(False, 0.05),
        ),
        Scenario(5, "same with appendfsync always", SAFE, SAFE, "redlock", _node_crash(True, 0.05)),
        Scenario(
            6,
            "restart delayed longer than the max TTL",
            SAFE,
            SAFE,
            "redlock",
            _node_crash(False, 1.5),
        ),
        Scenario(
            7,
            "server clock jump on one quorum node (early expiry)",
            POSSIBLE,
            SAFE,
            "redlock",
            _early_expiry,
        ),
        Scenario(8, "client wall-clock step (NTP)", SAFE, SAFE, "faketime", _clock_step),
        Scenario(9, "reply to SET lost (applied, unacknowledged)", SAFE, SAFE, None, _lost_replies),
        Scenario(10, "minority of nodes down / partitioned", SAFE, SAFE, "redlock", _nodes_down(2)),
        Scenario(11, "majority down", SAFE, SAFE, "redlock", _nodes_down(3)),
        Scenario(12, "renewal stalls (server paused)", SAFE, SAFE, "auto_renew", _renewal_stall),
        Scenario(
            13,
            "single master fails over to an async replica (fair=False; the fence counter "
            "fails over with it, behind)",
            POSSIBLE,
            SAFE,
            None,
            _failover(0),
        ),
        Scenario(
            13,
            "same, with replicas=1: a grant counts once the replica acknowledged it (WAIT)",
            SAFE,
            SAFE,
            None,
            _failover(1),
            label="13b",
        ),
        Scenario(
            14,
            "single server loses its data: FLUSHALL, kill -9 and restart without "
            "persistence, failover to a replica that missed the last grants",
            POSSIBLE,
            SAFE,
            None,
            _data_loss,
        ),
        Scenario(
            15,
            "the server's clock steps back (libfaketime, 1 h) as it loses its data: the "
            "assumption under the fences, broken",
            POSSIBLE,
            VIOLATION,
            "server_faketime",
            _server_clock_back,
        ),
        Scenario(
            16,
            "server closes idle clients (timeout 1), CLIENT KILL, restart with AOF while idle",
            SAFE,
            SAFE,
            None,
            _dropped_connections,
            available=True,
        ),
        Scenario(
            17,
            "a queued waiter killed with -9, then the holder releases",
            SAFE,
            SAFE,
            None,
            _queued_waiter_killed,
            max_gap=1.0,
        ),
        Scenario(
            18,
            "fork() while holding; the child leaves the with block by sys.exit",
            SAFE,
            SAFE,
            None,
            _fork_in_section,
        ),
        *ROW_19,
        *ROW_20,
    ]
}


# -- what this checkout supports --------------------------------------------------------


def faketime_library() -> str | None:
    """libfaketime, if the ``faketime`` package is installed."""
    if shutil.which("faketime") is None:
        return None
    for base in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib"):
        path = os.path.join(base, "faketime", "libfaketime.so.1")
        if os.path.exists(path):
            return path
    return None


def faketime_env(clock_file: str) -> dict[str, str]:
    """What to add to a process's environment to run it under libfaketime, its clock
    offset read from ``clock_file`` at every call ("+0", "-3600"...); the monotonic clock
    left real."""
    lib = faketime_library()
    assert lib is not None
    return {
        "LD_PRELOAD": lib,
        "FAKETIME_TIMESTAMP_FILE": clock_file,
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


@functools.cache
def _runs_under_faketime(binary: servers.ServerBinary) -> bool:
    """Whether this server starts under libfaketime (a build with jemalloc may not)."""
    with tempfile.TemporaryDirectory(prefix="redlease-clock-") as clock_dir:
        clock_file = os.path.join(clock_dir, "offset")
        with open(clock_file, "w") as f:
            f.write("-3600\n")
        probe = servers.ServerProcess(binary, env={**os.environ, **faketime_env(clock_file)})
        try:
            probe.start(timeout=5.0)
            with redis.Redis(port=probe.port, socket_timeout=2.0) as client:
                return bool(client.time()[0] < time.time() - 3000)  # (the offset applies)
        except RuntimeError:  # it did not start
            return False
        finally:
            probe.stop()  # (its work directory too, started or not)


def unsupported(need: str | None, binary: servers.ServerBinary) -> str | None:
    """Why a scenario cannot run here, or None if it can."""
    if need in ("faketime", "server_faketime") and faketime_library() is None:
        return "skipped: libfaketime not installed (apt package faketime)"
    if need == "server_faketime" and not _runs_under_faketime(binary):
        return f"skipped: {binary.kind}-server does not run under libfaketime here"
    return None


# -- running -------------------------------------------------------------------------------


def _url(proxy: FaultProxy) -> str:
    return f"redis://127.0.0.1:{proxy.port}/0"


@dataclass
class Deployment:
    lock_servers: list[servers.ServerProcess]  # the node's current master
    resource_server: servers.ServerProcess
    proxies: list[FaultProxy]  # shared, one per node (when the plan asks for them)
    replicas: list[servers.ServerProcess] = field(default_factory=list)  # one per node
    links: list[FaultProxy] = field(default_factory=list)  # replication, replica -> master
    paths: dict[int, list[FaultProxy]] = field(default_factory=dict)  # a worker's own
    postgres: Any = None  # rows 20: the PostgreSQL server behind the SQL gate

    def urls_for(self, worker: int) -> list[str]:
        if worker in self.paths:
            return [_url(p) for p in self.paths[worker]]
        if self.proxies:
            return [_url(p) for p in self.proxies]
        return [s.url for s in self.lock_servers]

    @property
    def all_proxies(self) -> list[FaultProxy]:
        return self.proxies + [p for own in self.paths.values() for p in own]


# A master sends a new replica its data at once (the default waits 5 s for more replicas).
PROMPT_SYNC = ["--repl-diskless-sync-delay", "0"]


def _start_replica(binary: servers.ServerBinary, master_port: int) -> servers.ServerProcess:
    replica = servers.ServerProcess(
        binary, extra_args=[*PROMPT_SYNC, "--replicaof", "127.0.0.1", str(master_port)]
    )
    return replica.start()


def _in_sync(master: servers.ServerProcess) -> None:
    with redis.Redis(port=master.port, socket_timeout=10.0) as client:
        client.set("chaos:replica-probe", 1)
        if client.wait(1, 10_000) < 1:  # attached and in sync before anything starts
            raise RuntimeError(f"the replica of port {master.port} did not catch up")
        client.delete("chaos:replica-probe")


@contextlib.contextmanager
def deploy(
    plan: Plan, binary: servers.ServerBinary, clock_file: str | None = None
) -> Iterator[Deployment]:
    started: list[servers.ServerProcess] = []
    proxies: list[FaultProxy] = []
    env = None
    if plan.server_faketime and clock_file:
        env = {**os.environ, **faketime_env(clock_file)}
    try:
        extra = [*(PROMPT_SYNC if plan.replica else []), *plan.server_args]
        for _ in range(plan.nodes):
            srv = servers.ServerProcess(
                binary, appendfsync_always=plan.aof, extra_args=extra, env=env
            )
            started.append(srv.start())
        dep = Deployment(list(started), servers.ServerProcess(binary).start(), [])
        started.append(dep.resource_server)
        if plan.replica:
            # Replication runs through a proxy of its own, so that a failover can lose
            # writes the way an asynchronous replica does (cut the link, then kill the
            # master: what the master sent since is gone, not held in a socket buffer).
            for master in dep.lock_servers:
                proxies.append(FaultProxy("127.0.0.1", master.port).start())
                dep.links.append(proxies[-1])
                dep.replicas.append(_start_replica(binary, proxies[-1].port))
                started.append(dep.replicas[-1])
                _in_sync(master)
        if plan.proxies:
            for srv in dep.lock_servers:
                proxies.append(FaultProxy("127.0.0.1", srv.port).start())
                dep.proxies.append(proxies[-1])
        for worker, delays in plan.paths.items():
            dep.paths[worker] = []
            for srv, delay in zip(dep.lock_servers, delays, strict=True):
                proxies.append(FaultProxy("127.0.0.1", srv.port).start())
                if delay:
                    proxies[-1].set_mode("delay", delay_ms=delay)
                dep.paths[worker].append(proxies[-1])
        if plan.gates:
            from ..postgres import PostgresProcess

            dep.postgres = PostgresProcess().start()
        yield dep
    finally:
        for proxy in proxies:
            proxy.stop()
        for srv in started:
            srv.stop()
        if plan.gates and "dep" in locals() and dep.postgres is not None:
            dep.postgres.close()


class _Nemesis:
    """Runs the plan's events at their offsets, and resumes workers that stopped
    themselves (SIGSTOP) after ``stop_seconds``."""

    def __init__(self, plan: Plan, dep: Deployment, start: float, clock_file: str | None):
        self.plan, self.dep, self.start, self.clock_file = plan, dep, start, clock_file
        self.heals: list[float] = []
        self.log: list[tuple[float, str]] = []
        self.windows: list[tuple[float, float, str]] = []
        self._open: dict[str, float] = {}
        self._done = threading.Event()
        self.pids: list[int] = []

    def run(self) -> None:
        for offset, action, fargs in sorted(self.plan.events, key=lambda e: e[0]):
            if self._done.wait(max(0.0, self.start + offset - time.monotonic())):
                return
            try:
                self._do(action, fargs)
            except Exception as exc:
                self.log.append((time.monotonic(), f"{action} failed: {exc}"))

    def _window(self, key: str, opening: bool) -> None:
        now = time.monotonic()
        if opening:
            self._open.setdefault(key, now)
        elif key in self._open:
            self.windows.append((self._open.pop(key), now, key))

    def _do(self, action: str, fargs: tuple[Any, ...]) -> None:
        now = time.monotonic()
        self.log.append((now, f"{action} {fargs}"))
        if action == "heal":
            self.heals.append(now)
            return
        if action == "clock":
            assert self.clock_file is not None
            with open(self.clock_file, "w") as f:
                f.write(f"{int(fargs[0]):+d}\n")
            self._window("clock step", fargs[0] != 0)
            return
        if action == "path":  # one worker's own proxy to one node
            worker, node, mode, delay = fargs
            self.dep.paths[worker][node].set_mode(mode, delay_ms=delay)
            return
        node = fargs[0]
        srv = self.dep.lock_servers[node]
        if action in ("cut_replication", "failover", "rejoin"):
            self._replication(action, node)
        elif action == "pause":
            srv.pause()
            self._window(f"node {node} paused", True)
        elif action == "resume":
            srv.resume()
            self._window(f"node {node} paused", False)
        elif action == "kill":
            srv.kill()
            self._window(f"node {node} down", True)
        elif action == "restart":
            srv.restart()
            self._window(f"node {node} down", False)
        elif action == "proxy":
            mode, delay = fargs[1], fargs[2]
            self.dep.proxies[node].set_mode(mode, delay_ms=delay)
            if mode != "pass":
                self._window(f"node {node} {mode}", True)
            for key in list(self._open):
                if key.startswith(f"node {node} ") and key != f"node {node} {mode}":
                    self._window(key, False)
        elif action == "flushall":
            with redis.Redis(port=srv.port, socket_timeout=2.0) as client:
                client.flushall()
        elif action == "client_kill":
            with redis.Redis(port=srv.port, socket_timeout=1.0) as client:
                client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        elif action == "pexpire":
            with redis.Redis(port=srv.port, socket_timeout=1.0) as client:
                for key in client.scan_iter("*"):
                    if not key.endswith(b":fence") and client.pttl(key) > 0:
                        client.pexpire(key, 1)

    def _replication(self, action: str, node: int) -> None:
        master, replica = self.dep.lock_servers[node], self.dep.replicas[node]
        if action == "cut_replication":
            self.dep.links[node].set_mode("blackhole")
            self._window(f"node {node} replication cut, then failover", True)
        elif action == "failover":
            # The master dies; its replica (which missed the latest writes) is promoted and
            # the node's address moves to it.
            master.kill()
            with redis.Redis(port=replica.port, socket_timeout=5.0) as client:
                client.execute_command("REPLICAOF", "NO", "ONE")
            self.dep.proxies[node].retarget("127.0.0.1", replica.port)
            self.dep.proxies[node].reset_connections()
            self.dep.lock_servers[node], self.dep.replicas[node] = replica, master
            self._window(f"node {node} replication cut, then failover", False)
        else:  # rejoin: the old master comes back, empty, as the new master's replica
            replica.extra_args = [*PROMPT_SYNC, "--replicaof", "127.0.0.1", str(master.port)]
            replica.restart()

    def watch_stops(self) -> None:
        """SIGCONT each worker that stopped itself, ``stop_seconds`` after it stopped."""
        stopped: dict[int, float] = {}
        while not self._done.wait(0.01):
            for pid in self.pids:
                if pid in stopped:
                    if time.monotonic() - stopped[pid] >= self.plan.stop_seconds:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGCONT)
                        del stopped[pid]
                        self._window(f"worker pid {pid} stopped", False)
                elif _is_stopped(pid):
                    stopped[pid] = time.monotonic()
                    self._window(f"worker pid {pid} stopped", True)
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def finish(self) -> None:
        self._done.set()
        for key in list(self._open):
            self._window(key, False)


def _is_stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def _worker_env(plan: Plan, clock_file: str | None) -> dict[str, str]:
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    if plan.faketime and clock_file is not None:
        env.update(faketime_env(clock_file))
    return env


def run_plan(plan: Plan, binary: servers.ServerBinary, name: str = "chaos") -> Record:
    """Run one plan against fresh servers; return everything the checker needs."""
    faked = plan.faketime or plan.server_faketime
    clock_dir = tempfile.mkdtemp(prefix="redlease-clock-") if faked else None
    clock_file = os.path.join(clock_dir, "offset") if clock_dir else None
    if clock_file:
        with open(clock_file, "w") as f:
            f.write("+0\n")
    procs: list[subprocess.Popen[str]] = []
    threads: list[threading.Thread] = []
    try:
        with deploy(plan, binary, clock_file) as dep:
            res_client = redis.Redis(port=dep.resource_server.port)
            try:
                return _run(plan, dep, res_client, name, clock_file, procs, threads)
            finally:
                res_client.close()
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for thread in threads:
            thread.join(10)
        if clock_dir:
            shutil.rmtree(clock_dir, ignore_errors=True)


def _run(
    plan: Plan,
    dep: Deployment,
    res_client: redis.Redis,
    name: str,
    clock_file: str | None,
    procs: list[subprocess.Popen[str]],
    threads: list[threading.Thread],
) -> Record:
    resource.reset(res_client)
    dsn = dep.postgres.dsn if dep.postgres is not None else ""
    if dsn:
        resource.reset_gates(res_client, dsn)
    env = _worker_env(plan, clock_file)
    outputs: dict[int, str] = {}
    for i in range(plan.processes):
        config = {
            "worker": i,
            "lock_urls": dep.urls_for(i),
            "audit_urls": [s.url for s in dep.lock_servers] if plan.audit else [],
            "to_validity": i in plan.to_validity,
            "think": plan.think,
            "resource_url": dep.resource_server.url,
            "contender": plan.contender,
            "name": name,
            "ttl": plan.ttl,
            "duration": plan.duration,
            "work": plan.work,
            "timeout": plan.timeout,
            "socket_timeout": plan.socket_timeout,
            "pauses": plan.pauses,
            "forks": plan.forks,
            "die_waiting": plan.die_waiting.get(i),
            "auto_renew": plan.auto_renew,
            "primitive": plan.primitive,
            "between": plan.between,
            "options": plan.options,
            "gates_dsn": dsn,
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "redlease.tools.chaos.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        procs.append(proc)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(config) + "\n")
        proc.stdin.flush()
    start = _all_ready(procs) + 0.1
    for i, proc in enumerate(procs):
        assert proc.stdin is not None
        with contextlib.suppress(OSError):  # a worker that died starting: collected below
            proc.stdin.write(f"{start}\n")
            proc.stdin.flush()

        def collect(i: int = i, proc: subprocess.Popen[str] = proc) -> None:
            try:
                out, err = proc.communicate(timeout=plan.duration + 90)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            outputs[i] = out
            if proc.returncode not in (0, -signal.SIGKILL):
                outputs[i] = out or json.dumps({"crash": err[-2000:]})

        thread = threading.Thread(target=collect)
        threads.append(thread)
        thread.start()
    nemesis = _Nemesis(plan, dep, start, clock_file)
    nemesis.pids = [p.pid for p in procs]
    helpers = [threading.Thread(target=nemesis.run), threading.Thread(target=nemesis.watch_stops)]
    for helper in helpers:
        helper.start()
    try:
        for thread in threads:
            thread.join(plan.duration + 120)
    finally:
        nemesis.finish()
        for helper in helpers:
            helper.join(30)
    # Heal everything the nemesis may have left broken, then look at the lock keys.
    for proxy in dep.all_proxies:
        proxy.set_mode("pass")
    no_ttl: list[str] = []
    for srv in dep.lock_servers + dep.replicas:
        with contextlib.suppress(OSError):
            srv.resume()
        no_ttl += _keys_without_ttl(srv.port)
    workers = []
    for i in range(plan.processes):
        text = outputs.get(i, "")
        if text:
            workers.append(json.loads(text))
        elif i in plan.die_waiting:  # as planned: its sections are lost with it
            workers.append({"worker": i, "sections": [], "died_waiting": True})
        else:
            workers.append({"worker": i, "killed": True})
    return Record(
        plan=plan,
        workers=workers,
        resource=resource.state(res_client),
        keys_without_ttl=no_ttl,
        gates=resource.gate_state(res_client, dsn) if dsn else {},
        start=start,
        heals=nemesis.heals,
        fault_windows=nemesis.windows,
        nemesis_log=nemesis.log,
    )


def _all_ready(procs: list[subprocess.Popen[str]], timeout: float = 30.0) -> float:
    """Wait until every worker has said "ready" (imports done, lock built): the run then
    starts at once instead of after a guess at how long starting takes."""
    deadline = time.monotonic() + timeout
    waiting = {p.stdout: p for p in procs if p.stdout is not None}
    while waiting and time.monotonic() < deadline:
        readable, _, _ = select.select(list(waiting), [], [], deadline - time.monotonic())
        for stream in readable:
            stream.readline()  # "ready", or "" from a worker that died: either way, done
            del waiting[stream]
    return time.monotonic()


def _keys_without_ttl(port: int) -> list[str]:
    found: list[str] = []
    try:
        with redis.Redis(port=port, socket_timeout=2.0) as client:
            for key in client.scan_iter("*"):
                text = key.decode()
                if client.pttl(key) == -1:
                    found.append(text)
    except redis.RedisError:
        pass  # a node left down: nothing to look at
    return found


def run_scenario(
    number: str, binary: servers.ServerBinary, seed: int, quick: bool
) -> tuple[Scenario, Outcome | None, str | None]:
    scenario = SCENARIOS[number]
    why = unsupported(scenario.needs, binary)
    if why is not None:
        return scenario, None, why
    place = list(SCENARIOS).index(number) + 1  # (each row its own random stream)
    plan = scenario.plan(random.Random(seed * 100 + place), quick)
    return scenario, check(run_plan(plan, binary)), None


# -- the broken locks: the checker must be shown able to fail ------------------------------


@dataclass(frozen=True)
class BrokenCase:
    key: str
    lock: str
    window: str
    catches: str
    plan: Callable[[random.Random, bool], Plan]
    caught: Callable[[Outcome], bool]
    needs: str | None = None


def _wrong_release(contender: str, between: str | None) -> Callable[[random.Random, bool], Plan]:
    def plan(rng: random.Random, quick: bool) -> Plan:
        p = Plan(contender=contender, ttl=0.5, work=0.1, processes=3, duration=4.0)
        p.between = between
        if between is None:  # the holder itself overruns its lease, then DELs
            p.pauses = [
                {"worker": 0, "section": k, "kind": "sleep", "seconds": 1.25} for k in (0, 2, 4)
            ]
        return p

    return plan


def _crash_between(rng: random.Random, quick: bool) -> Plan:
    return Plan(
        contender="setnx-expire", ttl=0.5, processes=3, duration=3.0, timeout=1.0, between="kill"
    )


def _broken_redlock(flaw: str, node_timeout: float | None = None, **fields: Any) -> Plan:
    """Three nodes, ttl 1 s, and one of ``chaos.unsafe.Unsafe``'s flaws switched on."""
    options: dict[str, Any] = {"unsafe": {flaw: True}}
    if node_timeout is not None:
        options["node_timeout"] = node_timeout
    fields.setdefault("duration", 4.0)
    return Plan(contender="redlock", nodes=3, ttl=1.0, options=options, **fields)


def _slow_acquirer(rng: random.Random, quick: bool) -> Plan:
    # Worker 0 reaches every node through a 150 ms delay each way, so its acquisitions
    # take ~0.3 s, and it works until just before the validity it was given. The other
    # comes straight in, pauses between sections (or worker 0 would hardly ever get in)
    # and retries as soon as the keys expire.
    return _broken_redlock(
        "ignore_elapsed",
        node_timeout=0.5,
        processes=2,
        duration=5.0,
        think=0.3,
        paths={0: [150.0, 150.0, 150.0]},
        to_validity=[0],
    )


def _split_nodes(rng: random.Random, quick: bool) -> Plan:
    # Worker 0 reaches node 0 at once and nodes 1 and 2 40 ms late: another worker that
    # tries in between takes nodes 1 and 2 while worker 0 keeps node 0.
    return _broken_redlock("half_quorum", node_timeout=0.3, paths={0: [0.0, 40.0, 40.0]})


def _lost_acquire_replies(rng: random.Random, quick: bool) -> Plan:
    # One reply from node 1 to worker 0 is lost every ~0.25 s (the command was applied);
    # the others pause between sections, so that worker 0's acquisitions mostly succeed.
    p = _broken_redlock(
        "release_believed_only",
        socket_timeout=0.3,
        think=0.1,
        paths={0: [0.0, 0.0, 0.0]},
        audit=True,
    )
    t = 0.3
    while t < p.duration - 0.5:
        p.events.append((t, "path", (0, 1, "drop_next_reply", 0)))
        t += 0.2 + rng.random() * 0.1
    return p


def safe_twin(plan: Plan) -> Plan:
    """The same plan and faults with redlease's own lock in place of the broken one."""
    options = {k: v for k, v in plan.options.items() if k != "unsafe"}
    contender = plan.contender if plan.contender == "redlock" else "redlease"
    return replace(plan, contender=contender, options=options, between=None)


BROKEN: dict[str, BrokenCase] = {
    c.key: c
    for c in [
        BrokenCase(
            "plain-del",
            "SET NX PX, release by plain DEL",
            "holder sleeps past its ttl, then DELs",
            "overlaps between unpaused holders",
            _wrong_release("plain-del", None),
            lambda o: o.overlaps_unpaused > 0,
        ),
        BrokenCase(
            "get-del",
            "GET then DEL",
            "1.25 s pause between GET and DEL (ttl 0.5 s)",
            "overlaps between unpaused holders",
            _wrong_release("get-del", "1.25"),
            lambda o: o.overlaps_unpaused > 0,
        ),
        BrokenCase(
            "setnx-expire",
            "SETNX then EXPIRE",
            "SIGKILL between SETNX and EXPIRE",
            "key without TTL",
            _crash_between,
            lambda o: bool(o.keys_without_ttl),
        ),
        BrokenCase(
            "ignore-elapsed",
            "Redlock, validity ignores the time acquiring took",
            "one worker's replies 150 ms late each way (3 nodes)",
            "overlaps between unpaused holders",
            _slow_acquirer,
            lambda o: o.overlaps_unpaused > 0,
        ),
        BrokenCase(
            "half-quorum",
            "Redlock, N/2 nodes taken for a majority",
            "one worker 40 ms late to 2 of 3 nodes",
            "overlaps between unpaused holders",
            _split_nodes,
            lambda o: o.overlaps_unpaused > 0,
        ),
        BrokenCase(
            "release-believed",
            "Redlock, release only on the nodes that said yes",
            "one worker loses a reply from one node every ~0.25 s",
            "a released token still on a node",
            _lost_acquire_replies,
            lambda o: o.leftovers > 0,
        ),
    ]
}


def run_broken(
    key: str, binary: servers.ServerBinary, seed: int, *, twin: bool = False
) -> tuple[BrokenCase, Outcome]:
    """Run a broken lock through its fault; ``twin``: run redlease through the same."""
    case = BROKEN[key]
    plan = case.plan(random.Random(seed), True)
    return case, check(run_plan(safe_twin(plan) if twin else plan, binary))
