"""Fork safety: nothing a forked child does blocks on a lock that a thread of its parent
held at the fork (gunicorn's pattern: a parent that used locks forks its workers). A fork
copies every lock as it is, and one held by another thread stays held in the child for
good, as that thread does not exist there.

Two ways: each process-wide lock of redlease held on purpose by a thread of the parent
across one fork, the child then doing what takes it (deterministic, one site at a time);
and a parent busy with locks in many threads that forks 200 children one after another,
each taking and releasing locks of its own (the issue's report: 4 children in 160 hung).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import redlease
from families import ClientFamily
from redlease import _clients
from redlease._base import metrics as _metrics
from redlease._rules import lease as _lease
from redlease._sync import backend as _backend_sync
from redlease._sync import conn as _conn_sync
from redlease._sync import renewer as _renewer_sync
from redlease.tools import servers

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

CHILD_LIMIT = 10.0  # seconds: a child still running then is hung (it needs milliseconds)


def _fork() -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a threaded process
        return os.fork()


def _exit_code(pid: int, limit: float) -> int | None:
    """The child's exit code, or None if it was still running after ``limit`` s (it is
    killed then)."""
    ends = time.monotonic() + limit
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > ends:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.005)


@contextlib.contextmanager
def _held_by_another_thread(lock: Any) -> Iterator[None]:
    """``lock`` (anything ``with`` takes) held by a thread of this process meanwhile."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            done.wait(60)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(10), "the thread did not take the lock"
    try:
        yield
    finally:
        done.set()
        thread.join(10)


def _in_child(action: Callable[[], object]) -> int | None:
    """Fork; the child runs ``action`` and exits 0 (1 if it raised); the child's exit
    code, None if it hung."""
    pid = _fork()
    if pid == 0:
        code = 1
        try:
            action()
            code = 0
        finally:
            os._exit(code)
    return _exit_code(pid, CHILD_LIMIT)


# Each site: the lock a thread of the parent holds at the fork, and what the child does
# that takes it; both given the parent's client and a lock the parent made and used (its
# pool and hub exist). The child's own locks are named after the parent's.
Site = tuple[
    Callable[[redis.Redis, redlease.Lock], Any], Callable[[redis.Redis, redlease.Lock], object]
]


def _own(lock: redlease.Lock) -> str:
    return lock.name + ":child"


def _pool(r: redis.Redis) -> _conn_sync.Pool:
    return _conn_sync._POOLS[r.connection_pool][_backend_sync.pool_owner()]


def _cycle(lock: redlease.Lock) -> None:
    with lock.acquire(timeout=5):
        pass


def _wait_through_the_hub(r: redis.Redis, name: str) -> None:
    with redlease.Lock(r, name).acquire(timeout=5), pytest.raises(redlease.AcquireTimeout):
        redlease.Lock(r, name).acquire(timeout=0.05)


def _port(r: redis.Redis) -> int:
    return int(r.connection_pool.connection_kwargs["port"])


def _counts_lock(r: redis.Redis, lock: redlease.Lock) -> Any:
    instruments = _metrics.instruments()
    if instruments is None:
        pytest.skip("metrics are not recorded here (no opentelemetry-api)")
    return instruments.counts.lock


SITES: dict[str, Site] = {
    # the parent's pool (the child takes a connection through the parent's lock)
    "pool": (lambda r, lock: _pool(r)._guard, lambda r, lock: _cycle(lock)),
    # the registry of pools (a lock made in the child, on a client of its own)
    "pools registry": (
        lambda r, lock: _conn_sync._POOLS_GUARD,
        lambda r, lock: _cycle(redlease.Lock(type(r)(port=_port(r)), _own(lock))),
    ),
    # the pool's hub (the child waits)
    "hub": (
        lambda r, lock: _pool(r).hub._lock,  # type: ignore[union-attr]
        lambda r, lock: _wait_through_the_hub(r, _own(lock)),
    ),
    # the renewer (the child's lease is auto-renewed)
    "renewer": (
        lambda r, lock: _renewer_sync.RENEWER._cond,
        lambda r, lock: _cycle(redlease.Lock(r, _own(lock), auto_renew=True)),
    ),
    # lease transitions (the child's release)
    "lease transitions": (
        lambda r, lock: _lease._TRANSITIONS,
        lambda r, lock: _cycle(redlease.Lock(r, _own(lock))),
    ),
    # the metrics' acquisitions counts (the child's grant)
    "metrics counts": (_counts_lock, lambda r, lock: _cycle(redlease.Lock(r, _own(lock)))),
    # the metrics' configuration
    "metrics configuration": (
        lambda r, lock: _metrics._setting,
        lambda r, lock: redlease.metrics.configure(),
    ),
    # the client families' loading (a client made from a URL, as the CLI does)
    "client families": (
        lambda r, lock: _clients.registry._loading,
        lambda r, lock: _clients.from_url(f"redis://127.0.0.1:{_port(r)}").close(),
    ),
}


@needs_fork
@pytest.mark.parametrize("site", list(SITES))
def test_a_child_never_waits_for_a_lock_its_parent_held_at_the_fork(
    r: redis.Redis, name: str, site: str
) -> None:
    held_lock, child_does = SITES[site]
    lock = redlease.Lock(r, name)
    _wait_through_the_hub(r, name)  # the pool, a connection and the hub exist
    _cycle(lock)
    with _held_by_another_thread(held_lock(r, lock)):
        code = _in_child(lambda: child_does(r, lock))
    assert code is not None, f"the child hung on the {site} lock held at the fork"
    assert code == 0, f"the child failed (exit code {code})"
    _cycle(lock)  # and the parent goes on


# -- 200 forks of a busy parent ------------------------------------------------------------

FORKS = 200
MAX_HUNG = 3  # the parent stops forking after this many hung children (the test fails)

# The parent: threads keep locks busy (contended names, so waiters go through the hub;
# auto-renewed leases, so the renewer runs; new clients, so pools are made; an asyncio
# loop's locks), and metrics configured now and then; the main thread forks FORKS
# children, one after another. A child takes and releases locks of its own: through a
# lock the parent made before the fork (the parent's pool), and locks it makes (on the
# parent's client and on a new one), auto-renewed, one waited for, and an asyncio lock;
# then it exits at once. argv: module, client type, port, forks, the most hung children,
# a child's time limit. The last line of stdout: a summary.
_PARENT = textwrap.dedent("""
    import asyncio, faulthandler, importlib, json, os, sys, threading, time, traceback
    import warnings

    import redlease
    from redlease import _clients

    module, kind, port, forks, max_hung, limit = sys.argv[1:7]
    port, forks, max_hung, limit = int(port), int(forks), int(max_hung), float(limit)
    Client = getattr(importlib.import_module(module), kind)
    AsyncClient = getattr(importlib.import_module(module + ".asyncio"), kind)
    client = Client(port=port)
    url = f"redis://127.0.0.1:{port}"
    # Threads switch every 50 µs, not 5 ms: at a fork, a thread of the parent is inside
    # one critical section or another far more often.
    sys.setswitchinterval(50e-6)
    stop = threading.Event()
    running = threading.Event()  # cleared while a child runs: it has the CPU to itself
    running.set()
    errors = []
    cycles = [0]

    def guarded(fn):
        def run(*args):
            while not stop.is_set():
                running.wait()
                try:
                    fn(*args)
                    cycles[0] += 1
                except Exception as exc:
                    errors.append(repr(exc))
                    time.sleep(0.01)
        return run

    # Contended names: waiters wait through the hub; half the leases auto-renewed.
    busy = [
        redlease.Lock(client, f"busy:{n % 3}", ttl=5.0, auto_renew=n % 2 == 0)
        for n in range(9)
    ]
    # A name each: more connections in use at once than the pool keeps idle, so
    # connections are opened and closed (the pool's lock) all the time.
    solo = [redlease.Lock(client, f"solo:{n}", ttl=5.0) for n in range(12)]

    @guarded
    def cycle(lock):
        with lock.acquire(timeout=10):
            pass

    @guarded
    def make():  # a lock on a new client: a new pool, through the pools' registry
        redlease.Lock(Client(port=port), "made", ttl=5.0)

    @guarded
    def load():  # a client from a URL, as the CLI makes them: the client families
        _clients.from_url(url).close()

    @guarded
    def configure():  # the metrics' configuration
        redlease.metrics.configure()
        time.sleep(0.001)

    def in_loop():
        async def main():
            aclient = AsyncClient(port=port)
            locks = [redlease.AsyncLock(aclient, "abusy", ttl=5.0, auto_renew=True)
                     for _ in range(3)]

            async def turn(lock):
                while not stop.is_set():
                    while not running.is_set():
                        await asyncio.sleep(0.005)
                    try:
                        lease = await lock.acquire(timeout=10)
                        await lease.release()
                    except Exception as exc:
                        errors.append(repr(exc))
                        await asyncio.sleep(0.01)

            await asyncio.gather(*(turn(lock) for lock in locks))
            await aclient.aclose()
        asyncio.run(main())

    threads = [threading.Thread(target=cycle, args=(lock,)) for lock in busy + solo]
    threads += [threading.Thread(target=make) for _ in range(2)]
    threads += [threading.Thread(target=fn) for fn in (load, configure, in_loop)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # every thread under way

    def child(i, made):
        faulthandler.dump_traceback_later(limit - 2)  # where a hung child hangs, to stderr
        with made.acquire(timeout=5):  # made in the parent: the parent's pool
            pass
        own = redlease.Lock(client, f"child:{i}", ttl=5.0, auto_renew=True)  # the renewer
        with own.acquire(timeout=5):
            try:  # a wait: the hub
                redlease.Lock(client, f"child:{i}").acquire(timeout=0.01)
                raise AssertionError("the child's own lock was taken twice")
            except redlease.AcquireTimeout:
                pass
        fresh = Client(port=port)  # the pools' registry
        with redlease.Lock(fresh, f"child:{i}:fresh", ttl=5.0).acquire(timeout=5):
            pass
        _clients.from_url(url)  # the client families
        redlease.metrics.configure()  # the metrics' configuration
        asyncio.run(in_a_loop_of_its_own(i))

    async def in_a_loop_of_its_own(i):
        aclient = AsyncClient(port=port)
        lock = redlease.AsyncLock(aclient, f"child:{i}:async", ttl=5.0, auto_renew=True)
        lease = await lock.acquire(timeout=5)
        await lease.release()
        await aclient.aclose()

    ok, hung, failed = 0, [], []
    for i in range(forks):
        made = redlease.Lock(client, f"child:{i}:made", ttl=5.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork of a threaded process
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                child(i, made)
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        # The parent's threads end the cycle they are in (after the fork: that changes
        # nothing the child has), and start again once it is gone, before the next fork.
        running.clear()
        code = _exit_code(pid, limit)
        running.set()
        time.sleep(0.02)  # every thread back in its loop
        if code == 0:
            ok += 1
        elif code is None:
            hung.append(i)
            if len(hung) >= max_hung:
                break
        else:
            failed.append((i, code))
    stop.set()
    running.set()
    for thread in threads:
        thread.join(15)
    alive = [thread.name for thread in threads if thread.is_alive()]
    print(json.dumps({"forks": i + 1, "ok": ok, "hung": hung, "failed": failed,
                      "parent_cycles": cycles[0], "parent_errors": errors[:5],
                      "parent_threads_stuck": alive}))
    sys.stdout.flush()
    os._exit(0)
""")
# (the child's end is read as the tests here read it: the same function, prepended)
_PARENT = "import os, time\n" + inspect.getsource(_exit_code) + _PARENT


def _run_busy_parent(port: int, family: ClientFamily, forks: int) -> dict[str, Any]:
    argv = [family.sync.__name__, family.client_type, str(port), str(forks), str(MAX_HUNG)]
    done = subprocess.run(
        [sys.executable, "-c", _PARENT, *argv, str(CHILD_LIMIT)],
        capture_output=True,
        text=True,
        timeout=60 + MAX_HUNG * CHILD_LIMIT,
    )
    assert done.returncode == 0, f"the parent failed:\n{done.stderr[-4000:]}"
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    summary["stderr"] = done.stderr[-4000:]
    return summary


@needs_fork
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_200_forks_of_a_busy_parent_all_finish(
    server: servers.ServerProcess, family: ClientFamily
) -> None:
    summary = _run_busy_parent(server.port, family, FORKS)
    stderr = summary.pop("stderr")
    assert summary["hung"] == [], f"children hung: {summary}\n{stderr}"
    assert summary["failed"] == [], f"children failed: {summary}\n{stderr}"
    assert summary["ok"] == FORKS, summary
    assert summary["parent_errors"] == [], summary
    assert summary["parent_threads_stuck"] == [], summary
    assert summary["parent_cycles"] > FORKS, summary  # the parent was busy throughout
