"""A release releases: when ``release()`` (or the end of a ``with`` block) returns, the
name is free on the server. Whatever the process does next (loops on, ends, exits
without cleanup, lives on as a pool worker), the next caller in any process gets the name
at once, not a ttl later. Every way a process can end is checked in a real child process,
many times over, since a grant kept back for a moment is a race the process's end can win.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import redlease
from conftest import _KINDS as KINDS
from families import ClientFamily
from redlease.tools import servers
from waiting_helpers import lock_key

RUNS = 20  # children per way of ending: a race lost 1 run in 8 still fails the test
SECTIONS = 50  # `with lock: pass` per child: enough for a lock that comes straight back
FREE_WITHIN = 0.2  # the promise: the next caller has the name this soon
LOOK_FOR = 3.0  # how long a test keeps looking, to tell "late" from "a ttl later"
TTL = 30.0  # far longer than LOOK_FOR: a name left held shows as held, not as late

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

# A child's arguments: its client's family and server (module, class, port), the lock
# name, how many sections; then the scripts' own.
_ARGV = """
import importlib, sys
import redlease
module, kind, port, name, count = sys.argv[1:6]
"""
_CLIENT = _ARGV + "client = getattr(importlib.import_module(module), kind)(port=int(port))\n"

# A script that runs the sections and ends as sys.argv[6] says.
_SYNC_SCRIPT = _CLIENT + textwrap.dedent("""
    import os
    lock = redlease.Lock(client, name, ttl=float(sys.argv[7]))
    for _ in range(int(count)):
        with lock:
            pass
    if sys.argv[6] == "os._exit":
        os._exit(0)  # no atexit, no finalizers
""")

_ASYNC_SCRIPT = _ARGV + textwrap.dedent("""
    import asyncio

    async def main():
        lock = redlease.AsyncLock(client, name, ttl=float(sys.argv[7]))
        for _ in range(int(count)):
            async with lock:
                pass

    client = getattr(importlib.import_module(module + ".asyncio"), kind)(port=int(port))
    if sys.argv[6] == "asyncio.run":
        asyncio.run(main())
    else:  # a bare loop: no shutdown of async generators or executors
        loop = asyncio.new_event_loop()
        loop.run_until_complete(main())
        loop.close()
""")

# One contender of the hot-lock test: its sections, each acquire's wait timed. A lock
# object per section, or one for them all (sys.argv[6]). The process's one-time costs
# (connecting; the first lock object imports what tells the client's family) are paid
# before, so a wait is a wait for the lock.
_CONTENDER_SCRIPT = _CLIENT + textwrap.dedent("""
    import json, time
    client.ping()
    shared = redlease.Lock(client, name, ttl=5.0)
    done, longest = 0, 0.0
    for _ in range(int(count)):
        lock = shared if sys.argv[6] == "one" else redlease.Lock(client, name, ttl=5.0)
        asked = time.monotonic()
        with lock:
            longest = max(longest, time.monotonic() - asked)
        done += 1
    print(json.dumps({"sections": done, "max_wait": longest}))
""")


def _client_argv(family: ClientFamily, server: servers.ServerProcess) -> list[str]:
    return [family.sync.__name__, family.client_type, str(server.port)]


def _sections(module: str, kind: str, port: int, name: str, count: int) -> None:
    """A child's work (multiprocessing, pool, fork): ``count`` sections in a row on one
    lock object, as a process that takes the lock in a loop does."""
    client = getattr(importlib.import_module(module), kind)(port=port)
    lock = redlease.Lock(client, name, ttl=TTL)
    for _ in range(count):
        with lock:
            pass


def _script(
    code: str, family: ClientFamily, server: servers.ServerProcess, name: str, ending: str
) -> None:
    """Run a ``python -c`` child to its end."""
    argv = [*_client_argv(family, server), name, str(SECTIONS), ending, str(TTL)]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def _free_after(family: ClientFamily, server: servers.ServerProcess, name: str) -> float | None:
    """Seconds until a fresh lock object on a fresh client took ``name``, 0.0 when the
    first try did; None if it was still held after LOOK_FOR. The lease is given back."""
    client = family.client(port=server.port)
    try:
        client.ping()  # connected before the clock starts
        started = time.monotonic()
        first = True
        while True:
            lease = redlease.Lock(client, name, ttl=TTL).try_acquire()
            if lease is not None:
                lease.release()
                return 0.0 if first else time.monotonic() - started
            if time.monotonic() - started > LOOK_FOR:
                return None
            first = False
            time.sleep(0.002)
    finally:
        client.close()


def _every_run_frees(
    family: ClientFamily,
    server: servers.ServerProcess,
    name: str,
    run_child: Callable[[str], None],
) -> None:
    """RUNS times: a child takes a lock name of its own SECTIONS times and ends
    (``run_child`` returns once it has); the name must be free at once. Looked for longer
    only to say how late it was."""
    for run in range(RUNS):
        mine = f"{name}:{run}"
        run_child(mine)
        delay = _free_after(family, server, mine)
        if delay is None:
            found = f"still held {LOOK_FOR:.0f} s later"
        else:
            found = f"free only {delay * 1000:.1f} ms later"
        # Free at the first look: release() returned in the child before it ended, so
        # nothing is left to happen; a release kept back would show as a delay here.
        assert delay == 0.0, (
            f"run {run + 1}/{RUNS}: once the child had ended, the name was {found} "
            f"(the promise: free at once; the next caller has it within "
            f"{FREE_WITHIN * 1000:.0f} ms at most)"
        )


def _forked(target: Callable[[], None]) -> None:
    """Fork; the child runs ``target`` and leaves with os._exit (0 iff it returned)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            target()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# -- 1. every way a process can end ------------------------------------------------------------


@needs_fork
def test_a_multiprocessing_child_leaves_the_name_free(
    server: servers.ServerProcess, family: ClientFamily, name: str
) -> None:
    # The fork start method: the child ends with os._exit once its target returns.
    ctx = multiprocessing.get_context("fork")

    def run_child(mine: str) -> None:
        child = ctx.Process(
            target=_sections,
            args=(family.sync.__name__, family.client_type, server.port, mine, SECTIONS),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
            child.start()
        child.join(60)
        assert child.exitcode == 0
        child.close()

    _every_run_frees(family, server, name, run_child)


def _one_server_kind(server_kind: str) -> None:
    """A process's end gives its leases back on the client's side: whatever the server's
    kind, the same code runs, so the slowest of these (a hundred processes each) run on
    one kind."""
    if server_kind != KINDS[-1]:
        pytest.skip("a process's end is the client's: once, on one server kind, is enough")


@pytest.mark.slow
def test_a_child_that_calls_os_exit_leaves_the_name_free(
    server: servers.ServerProcess, server_kind: str, family: ClientFamily, name: str
) -> None:
    _one_server_kind(server_kind)
    _every_run_frees(
        family, server, name, lambda mine: _script(_SYNC_SCRIPT, family, server, mine, "os._exit")
    )


def test_a_process_pool_worker_leaves_the_name_free(
    server: servers.ServerProcess, family: ClientFamily, name: str
) -> None:
    # One worker for all the runs, looked at while it lives on: a task's end is no end
    # of its process, so nothing at exit could give a kept grant back.
    spawn = multiprocessing.get_context("spawn")  # (no fork of this threaded process)
    argv = (family.sync.__name__, family.client_type, server.port)
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        pool.submit(int).result(timeout=60)  # the worker has started (and imported)
        _every_run_frees(
            family,
            server,
            name,
            lambda mine: pool.submit(_sections, *argv, mine, SECTIONS).result(timeout=60),
        )


@needs_fork
def test_a_forked_child_leaves_the_name_free(
    r: redis.Redis, server: servers.ServerProcess, family: ClientFamily, name: str
) -> None:
    # The parent has used this very lock object (and redlease's machinery) before the
    # fork; the child carries on with that object and leaves with os._exit.
    def run_child(mine: str) -> None:
        lock = redlease.Lock(r, mine, ttl=TTL)

        def sections() -> None:
            for _ in range(SECTIONS):
                with lock:
                    pass

        sections()
        _forked(sections)

    _every_run_frees(family, server, name, run_child)


@pytest.mark.slow
def test_a_script_that_just_ends_leaves_the_name_free(
    server: servers.ServerProcess, server_kind: str, family: ClientFamily, name: str
) -> None:
    _one_server_kind(server_kind)
    _every_run_frees(
        family, server, name, lambda mine: _script(_SYNC_SCRIPT, family, server, mine, "ends")
    )


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["asyncio.run", "run_until_complete"])
def test_an_asyncio_script_leaves_the_name_free(
    server: servers.ServerProcess, server_kind: str, family: ClientFamily, name: str, ending: str
) -> None:
    _one_server_kind(server_kind)
    _every_run_frees(
        family, server, name, lambda mine: _script(_ASYNC_SCRIPT, family, server, mine, ending)
    )


# -- 2. in one process -------------------------------------------------------------------------


def test_a_lock_taken_in_a_loop_is_free_for_another_object(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=TTL)
    for _ in range(20):
        with lock:
            pass
        assert r.exists(lock_key(name)) == 0, "still held on the server after `with`"
    other = redlease.Lock(r, name, ttl=TTL).try_acquire()
    assert other is not None
    other.release()


async def test_an_async_lock_taken_in_a_loop_is_free_for_another_object(
    ar: aredis.Redis, name: str
) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=TTL)
    for _ in range(20):
        async with lock:
            pass
        assert await ar.exists(lock_key(name)) == 0, "still held after `async with`"
    other = await redlease.AsyncLock(ar, name, ttl=TTL).try_acquire()
    assert other is not None
    await other.release()


def test_the_outermost_exit_frees_a_reentrant_lock(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=TTL, reentrant=True)
    for _ in range(20):
        with lock:
            with lock:
                pass
            assert r.exists(lock_key(name)) == 1  # an inner exit keeps it
        assert r.exists(lock_key(name)) == 0, "still held after the outermost `with`"
    other = redlease.Lock(r, name, ttl=TTL).try_acquire()
    assert other is not None
    other.release()


async def test_the_outermost_exit_frees_a_reentrant_async_lock(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=TTL, reentrant=True)
    for _ in range(20):
        async with lock:
            async with lock:
                pass
            assert await ar.exists(lock_key(name)) == 1
        assert await ar.exists(lock_key(name)) == 0, "still held after the outermost exit"
    other = await redlease.AsyncLock(ar, name, ttl=TTL).try_acquire()
    assert other is not None
    await other.release()


# -- 3. a hot lock among processes -------------------------------------------------------------

CONTENDERS = 8
HOT_SECTIONS = 400
LONGEST_WAIT = 0.5  # a section waits for the others' short sections, never for a ttl


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("objects", ["each", "one"], ids=["object-per-section", "one-object"])
def test_a_hot_lock_keeps_every_wait_short(
    server: servers.ServerProcess, family: ClientFamily, name: str, objects: str
) -> None:
    # Started one after another, no barrier: the first ones run alone for a while, the
    # last ones may find the others done. No wait is for a name left held (ttl 5 s), nor
    # for a process that takes one object in a loop and keeps the name from the others.
    argv = [*_client_argv(family, server), name, str(HOT_SECTIONS), objects]
    contenders = [
        subprocess.Popen(
            [sys.executable, "-c", _CONTENDER_SCRIPT, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(CONTENDERS)
    ]
    reports: list[dict[str, Any]] = []
    try:
        for contender in contenders:
            out, err = contender.communicate(timeout=110)
            assert contender.returncode == 0, err
            reports.append(json.loads(out))
    finally:
        for contender in contenders:
            if contender.poll() is None:
                contender.kill()
                contender.wait()
    waits = [report["max_wait"] for report in reports]
    print(f"longest wait per contender (ms): {[round(w * 1000, 1) for w in waits]}")
    assert [report["sections"] for report in reports] == [HOT_SECTIONS] * CONTENDERS
    assert max(waits) <= LONGEST_WAIT, (
        f"a section waited {max(waits) * 1000:.0f} ms (at most {LONGEST_WAIT * 1000:.0f} ms); "
        f"each contender's longest: {[round(w * 1000) for w in waits]} ms"
    )
