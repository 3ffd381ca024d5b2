"""Scenarios of SAFETY.md, the nemesis that injects their faults on a seeded schedule,
and the runner that starts servers, proxies and worker processes and hands the records
to the checker.

Everything runs on 127.0.0.1; every process and proxy started here is stopped in a
``finally``. Faults that must produce a violation are made deterministic (a pause longer
than the ttl at a chosen section), never left to a race.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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
    faketime: bool = False
    between: str | None = None  # broken locks: "kill" or seconds to sleep in the window
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    row: int
    fault: str
    expected_unfenced: str
    expected_fenced: str
    needs: str | None  # "redlock", "auto_renew", "faketime", "failover" or None
    plan: Callable[[random.Random, bool], Plan]


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


def _failover(rng: random.Random, quick: bool) -> Plan:
    return Plan()


SCENARIOS: dict[int, Scenario] = {
    s.row: s
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
            "single master fails over to an async replica",
            POSSIBLE,
            SAFE,
            "failover",
            _failover,
        ),
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


def unsupported(need: str | None) -> str | None:
    """Why a scenario cannot run here, or None if it can."""
    import redlease

    if need == "redlock":
        try:
            with redis.Redis() as probe:
                redlease.Redlock([probe], "probe", 1.0)
        except NotImplementedError:
            return "not supported yet (Redlock is not on main)"
        except Exception:
            pass
    elif need == "auto_renew":
        try:
            with redis.Redis() as probe:
                redlease.Lock(probe, "probe", 1.0, auto_renew=True)
        except NotImplementedError:
            return "not supported yet (auto-renewal is not on main)"
        except Exception:
            pass
    elif need == "faketime" and faketime_library() is None:
        return "skipped: libfaketime not installed (apt package faketime)"
    elif need == "failover":
        return "not run: the replica-failover nemesis is not built yet"
    return None


# -- running -------------------------------------------------------------------------------


@dataclass
class Deployment:
    lock_servers: list[servers.ServerProcess]
    resource_server: servers.ServerProcess
    proxies: list[FaultProxy]

    @property
    def lock_urls(self) -> list[str]:
        if self.proxies:
            return [f"redis://127.0.0.1:{p.port}/0" for p in self.proxies]
        return [s.url for s in self.lock_servers]


@contextlib.contextmanager
def deploy(plan: Plan, binary: servers.ServerBinary) -> Iterator[Deployment]:
    started: list[servers.ServerProcess] = []
    proxies: list[FaultProxy] = []
    try:
        for _ in range(plan.nodes):
            started.append(servers.ServerProcess(binary, appendfsync_always=plan.aof).start())
        res = servers.ServerProcess(binary).start()
        started.append(res)
        if plan.proxies:
            for srv in started[:-1]:
                proxies.append(FaultProxy("127.0.0.1", srv.port).start())
        yield Deployment(started[:-1], res, proxies)
    finally:
        for proxy in proxies:
            proxy.stop()
        for srv in started:
            srv.stop()


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
        node = fargs[0]
        srv = self.dep.lock_servers[node]
        if action == "pause":
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
        elif action == "pexpire":
            with redis.Redis(port=srv.port, socket_timeout=1.0) as client:
                for key in client.scan_iter("*"):
                    if not key.endswith(b":fence") and client.pttl(key) > 0:
                        client.pexpire(key, 1)

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
        lib = faketime_library()
        assert lib is not None
        env.update(
            LD_PRELOAD=lib,
            FAKETIME_TIMESTAMP_FILE=clock_file,
            FAKETIME_NO_CACHE="1",
            FAKETIME_DONT_FAKE_MONOTONIC="1",
        )
    return env


def run_plan(plan: Plan, binary: servers.ServerBinary, name: str = "chaos") -> Record:
    """Run one plan against fresh servers; return everything the checker needs."""
    clock_dir = tempfile.mkdtemp(prefix="redlease-clock-") if plan.faketime else None
    clock_file = os.path.join(clock_dir, "offset") if clock_dir else None
    if clock_file:
        with open(clock_file, "w") as f:
            f.write("+0\n")
    procs: list[subprocess.Popen[str]] = []
    threads: list[threading.Thread] = []
    try:
        with deploy(plan, binary) as dep:
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
    start = time.monotonic() + 1.5 + 0.4 * plan.processes
    env = _worker_env(plan, clock_file)
    outputs: dict[int, str] = {}
    for i in range(plan.processes):
        config = {
            "worker": i,
            "lock_urls": dep.lock_urls,
            "resource_url": dep.resource_server.url,
            "contender": plan.contender,
            "name": name,
            "ttl": plan.ttl,
            "duration": plan.duration,
            "start_at": start,
            "work": plan.work,
            "timeout": plan.timeout,
            "socket_timeout": plan.socket_timeout,
            "pauses": plan.pauses,
            "auto_renew": plan.auto_renew,
            "between": plan.between,
            "options": plan.options,
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "redlease.chaos.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        procs.append(proc)

        def collect(i: int = i, proc: subprocess.Popen[str] = proc, cfg: str = "") -> None:
            try:
                out, err = proc.communicate(cfg, timeout=plan.duration + 90)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            outputs[i] = out
            if proc.returncode not in (0, -signal.SIGKILL):
                outputs[i] = out or json.dumps({"crash": err[-2000:]})

        thread = threading.Thread(target=collect, kwargs={"cfg": json.dumps(config)})
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
    for proxy in dep.proxies:
        proxy.set_mode("pass")
    no_ttl: list[str] = []
    for srv in dep.lock_servers:
        with contextlib.suppress(OSError):
            srv.resume()
        no_ttl += _keys_without_ttl(srv.port)
    workers = []
    for i in range(plan.processes):
        text = outputs.get(i, "")
        workers.append(json.loads(text) if text else {"worker": i, "killed": True})
    return Record(
        plan=plan,
        workers=workers,
        resource=resource.state(res_client),
        keys_without_ttl=no_ttl,
        start=start,
        heals=nemesis.heals,
        fault_windows=nemesis.windows,
        nemesis_log=nemesis.log,
    )


def _keys_without_ttl(port: int) -> list[str]:
    found: list[str] = []
    try:
        with redis.Redis(port=port, socket_timeout=2.0) as client:
            for key in client.scan_iter("*"):
                text = key.decode()
                if not text.endswith(":fence") and client.pttl(key) == -1:
                    found.append(text)
    except redis.RedisError:
        pass  # a node left down: nothing to look at
    return found


def run_scenario(
    row: int, binary: servers.ServerBinary, seed: int, quick: bool
) -> tuple[Scenario, Outcome | None, str | None]:
    scenario = SCENARIOS[row]
    why = unsupported(scenario.needs)
    if why is not None:
        return scenario, None, why
    plan = scenario.plan(random.Random(seed * 100 + row), quick)
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
    ]
}


def run_broken(key: str, binary: servers.ServerBinary, seed: int) -> tuple[BrokenCase, Outcome]:
    case = BROKEN[key]
    return case, check(run_plan(case.plan(random.Random(seed), True), binary))
