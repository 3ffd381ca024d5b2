"""``redlease run`` as an operator meets it, through a real process: flock's options and
exit codes, signals passed on to the command's process group (and the lock kept until
the command has ended), and a lease lost while the command runs stopping all of it."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

import redlease
from cli_helpers import finish as _finish
from cli_helpers import start as _start
from redlease.tools import servers
from waiting_helpers import lock_key, wait_until

pytestmark = pytest.mark.slow


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


def test_nonblock_and_conflict_exit_code(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    with redlease.Lock(r, name, ttl=30.0):
        code, out, err = _finish(
            _start(["run", name, "-n", "--", *_py("print('ran')")], REDLEASE_URL=server.url)
        )
        assert (code, out) == (1, "")  # flock's default: 1, and the command never ran
        assert "held by others; gave up after one try" in err
        code, out, _ = _finish(
            _start(["run", name, "-n", "-E", "9", "--", "true"], REDLEASE_URL=server.url)
        )
        assert (code, out) == (9, "")
        started = time.monotonic()
        code, _, err = _finish(
            _start(["run", name, "-w", "300ms", "--json", "--", "true"], REDLEASE_URL=server.url)
        )
        assert code == 1
        assert time.monotonic() - started >= 0.3
        assert json.loads(err.splitlines()[-1]) == {"event": "busy", "name": name}
    # free again: -n takes it at once and passes the command's exit code
    code, _, _ = _finish(
        _start(["run", name, "-n", "--", *_py("raise SystemExit(4)")], REDLEASE_URL=server.url)
    )
    assert code == 4


def test_redlease_url_may_name_several_servers_for_a_redlock(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    urls = [f"redis://127.0.0.1:{server.port}/{db}" for db in (1, 2, 3)]
    probe = f"""
        import sys, redis
        from redlease._rules.keys import LockKeys
        nodes = [redis.Redis.from_url(u) for u in {urls!r}]
        held = [n.exists(LockKeys.for_name({name!r}).lock) for n in nodes]
        sys.exit(0 if held == [1, 1, 1] else 5)
    """
    proc = _start(["run", name, "--json", "--", *_py(probe)], REDLEASE_URL=",".join(urls))
    code, _, err = _finish(proc)
    assert code == 0, err
    # every line a JSON event, the warning that the test servers keep nothing on disk too
    events = [json.loads(line) for line in err.splitlines()]
    warned = [e for e in events if e["event"] == "warning"]
    assert warned, err
    assert all("keeps nothing on disk" in e["message"] for e in warned), err
    assert [e["event"] for e in events if e["event"] != "warning"] == ["acquired", "exit"]
    # without --json, a warning is a line of redlease's own, not Python's source location
    code, _, err = _finish(_start(["run", name, "--", "true"], REDLEASE_URL=",".join(urls)))
    assert code == 0, err
    warned_lines = [line for line in err.splitlines() if "keeps nothing on disk" in line]
    assert warned_lines, err
    assert all(line.startswith("redlease: warning: ") for line in warned_lines), err
    assert "sys.exit" not in err  # (the source line Python shows with a warning)
    for url in urls:
        assert redis.Redis.from_url(url).exists(lock_key(name)) == 0  # released on each


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_is_passed_on_and_the_lock_kept_until_the_command_ends(
    server: servers.ServerProcess, r: redis.Redis, name: str, tmp_path: Path, signum: int
) -> None:
    """Under `timeout 2 redlease run ...` the wrapper used to die at once and leave the
    command running unlocked: a second copy then overlapped the first."""
    said, go = tmp_path / "said", tmp_path / "go"
    job = f"""
        import signal, sys, time, pathlib
        said, go = pathlib.Path({str(said)!r}), pathlib.Path({str(go)!r})
        def stop(signum, frame):
            said.write_text("got " + str(signum))
            while not go.exists():  # winding down, still under the lock, till told
                time.sleep(0.01)
            said.write_text("done")
            sys.exit(3)
        signal.signal({int(signum)}, stop)
        said.write_text("ready")
        time.sleep(60)
    """
    proc = _start(["run", name, "--redis", server.url, "--", *_py(job)])
    wait_until(lambda: said.exists() and said.read_text() == "ready", 30)
    proc.send_signal(signum)
    wait_until(lambda: said.read_text().startswith("got"), 30)
    assert said.read_text() == f"got {int(signum)}"
    # the command is winding down: the lock is still held, nobody else gets it
    assert redlease.Lock(r, name, ttl=5.0).try_acquire() is None
    go.touch()
    code, _, err = _finish(proc)
    assert said.read_text() == "done"
    assert code == 3, err  # the command's own exit code
    assert r.exists(lock_key(name)) == 0  # released once it had ended


def test_a_signal_while_waiting_for_the_lock_stops_the_wait(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    with redlease.Lock(r, name, ttl=30.0):
        proc = _start(["run", name, "--redis", server.url, "--", *_py("print('ran')")])
        wait_until(lambda: r.llen(lock_key(name) + ":line") == 1, 30)  # queued
        proc.send_signal(signal.SIGTERM)
        code, out, err = _finish(proc)
    assert code == 128 + signal.SIGTERM
    assert out == ""
    assert "SIGTERM while waiting" in err
    lease = redlease.Lock(r, name, ttl=5.0).try_acquire()
    assert lease is not None  # nothing left behind
    lease.release()


def _job_with_a_grandchild(pids: Path, ignore_term: bool) -> list[str]:
    """A shell-like job: it starts a grandchild and waits for it (both record their pid)."""
    grandchild = "import os, time, signal, sys; "
    if ignore_term:
        grandchild += "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    grandchild += f"open({str(pids)!r}, 'a').write(str(os.getpid()) + ' '); time.sleep(120)"
    job = f"""
        import os, signal, subprocess, sys
        if {ignore_term}:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({str(pids)!r}, 'a').write(str(os.getpid()) + ' ')
        subprocess.run([sys.executable, '-c', {grandchild!r}])
    """
    return _py(job)


@pytest.mark.parametrize("ignore_term", [False, True], ids=["terminates", "ignores-sigterm"])
def test_a_lost_lease_stops_the_whole_process_group(
    server: servers.ServerProcess, r: redis.Redis, name: str, tmp_path: Path, ignore_term: bool
) -> None:
    pids = tmp_path / "pids"
    argv = ["run", name, "--redis", server.url, "--ttl", "1", "--grace", "0.5s", "--json", "--"]
    proc = _start([*argv, *_job_with_a_grandchild(pids, ignore_term)])
    wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2, 30)
    r.delete(lock_key(name))  # the lease is lost (an operator, a failover, an eviction)
    code, _, err = _finish(proc)
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert code == 75, err  # the lost code, not the command's
    lost = next(e for e in events if e["event"] == "lost")
    assert lost["stopping"] is True
    for pid in map(int, pids.read_text().split()):
        wait_until(lambda pid=pid: not _alive(pid), 30)  # SIGTERM, or SIGKILL after 0.5 s


def test_on_lost_warn_lets_the_command_finish(
    server: servers.ServerProcess, r: redis.Redis, name: str, tmp_path: Path
) -> None:
    said = tmp_path / "said"
    job = f"""
        import pathlib, time
        said = pathlib.Path({str(said)!r})
        said.write_text("ready")
        while said.read_text() != "go on":
            time.sleep(0.01)
        said.write_text("finished")
    """
    argv = ["run", name, "--redis", server.url, "--ttl", "1", "--on-lost", "warn", "--"]
    proc = _start([*argv, *_py(job)])
    wait_until(lambda: said.exists() and said.read_text() == "ready", 30)
    r.delete(lock_key(name))
    time.sleep(1.5)  # the renewer has found the lease gone by now (a ttl and more)
    said.write_text("go on")
    code, _, err = _finish(proc)
    assert said.read_text() == "finished"  # not stopped
    assert code == 75, err
    assert "lost lock" in err
    assert "stopping it" not in err
