"""The ``redlease`` command: ``run`` holds a lock around a command and passes its exit
code through; ``status`` reads a lock without touching it; ``chaos`` is delegated."""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable

import pytest
import redis

import redlease
from redlease.__main__ import main
from redlease._cli.command import duration
from redlease._rules.keys import LockKeys
from redlease.tools import servers
from waiting_helpers import lock_key


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_run_passes_the_exit_code_and_the_fence(
    server: servers.ServerProcess, name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", name, "--redis", server.url, "--"]
    code = main(
        argv + _py("import os, sys; print('fence=' + os.environ['REDLEASE_FENCE']); sys.exit(3)")
    )
    assert code == 3
    out, err = capfd.readouterr()
    fence = int(re.search(r"fence=(\d+)", out).group(1))  # type: ignore[union-attr]
    assert f"holding lock {name!r}, fence {fence}" in err
    assert main(argv + _py("pass")) == 0
    again = re.search(r"fence (\d+)", capfd.readouterr().err)
    assert again is not None
    assert int(again.group(1)) > fence


def test_run_holds_the_lock_while_the_command_runs(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    # The child tries the same lock: busy while we hold it (exit 0), free after.
    probe = f"""
        import sys, time, redis, redlease
        time.sleep(2.2)  # over twice the ttl: only renewal keeps the lease alive
        lock = redlease.Lock(redis.Redis.from_url({server.url!r}), {name!r}, ttl=1.0)
        sys.exit(0 if lock.try_acquire() is None else 5)
    """
    # (a ttl of 1 s: the renewer has slack on a loaded machine running tests in parallel)
    assert main(["run", name, "--redis", server.url, "--ttl", "1", "--", *_py(probe)]) == 0
    lease = redlease.Lock(r, name, ttl=1.0).try_acquire()
    assert lease is not None  # released afterwards
    lease.release()


def test_run_gives_up_when_the_lock_stays_busy(
    server: servers.ServerProcess, r: redis.Redis, name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    with redlease.Lock(r, name, ttl=5.0):
        code = main(
            ["run", name, "--redis", server.url, "--timeout", "0.2", "--", *_py("print('ran')")]
        )
    assert code == 1
    out, err = capfd.readouterr()
    assert "ran" not in out
    assert "held by others" in err


def test_run_a_missing_command(
    server: servers.ServerProcess, r: redis.Redis, name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", name, "--redis", server.url, "--", "no-such-command-here"]) == 127
    assert "cannot run 'no-such-command-here'" in capfd.readouterr().err
    assert r.exists(lock_key(name)) == 0  # the lock was given back


def test_run_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "job", "make"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "redlease run: error: put -- before the command" in err
    assert err.startswith("usage: redlease run NAME")  # run's usage, not the top level's
    for mistaken in (["run", "job"], ["list", "--bogus"], ["inspect", "x", "--bogus"]):
        with pytest.raises(SystemExit):
            main(mistaken)
        assert capsys.readouterr().err.startswith(f"usage: redlease {mistaken[0]}"), mistaken
    with pytest.raises(SystemExit):
        main(["run", "job", "--ttl", "-1", "--", "true"])
    assert "--ttl: not a duration: '-1'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "job", "--ttl", "0s", "--", "true"])
    assert "--ttl: must be a positive duration" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "job", "-n", "-w", "1", "--", "true"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "job", "-E", "256", "--", "true"])
    assert "an exit code is 0 to 255" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("2.5", 2.5),
        ("30s", 30.0),
        ("500ms", 0.5),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        (" 1.5S ", 1.5),
        (".5", 0.5),
        ("0", 0.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "-1", "1x", "1 h 2", "inf", "nan", "1e3", "5 mins"])
def test_durations_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        duration(text)


def test_status_free_and_held(
    server: servers.ServerProcess, r: redis.Redis, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", name, "--redis", server.url]) == 1  # free
    out = capsys.readouterr().out
    assert f"lock {name!r}: free" in out
    assert "fence counter: none" in out
    with redlease.Lock(r, name, ttl=5.0) as lease:
        assert main(["status", name, "--redis", server.url]) == 0  # held
        out = capsys.readouterr().out
        assert f"lock {name!r}: held" in out
        assert re.search(r"holder [0-9a-f]{8}… \(exclusive\): \d+\.\d+ s left", out)
        assert lease.token not in out  # never a whole token
        assert f"fence counter: {lease.fence}" in out
    assert r.exists(lock_key(name)) == 0
    assert main(["status", name, "--redis", server.url]) == 1
    assert "free" in capsys.readouterr().out


def test_status_reports_a_lock_without_ttl(
    server: servers.ServerProcess, r: redis.Redis, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    r.set(lock_key(name), "someone")
    assert main(["status", name, "--redis", server.url]) == 0
    assert "WARNING: no TTL" in capsys.readouterr().out


def test_status_errors(capsys: pytest.CaptureFixture[str]) -> None:
    port = servers.free_port()
    assert main(["status", "job", "--redis", f"redis://127.0.0.1:{port}/0"]) == 2
    assert "cannot reach the server" in capsys.readouterr().err
    assert main(["status", "", "--redis", f"redis://127.0.0.1:{port}/0"]) == 2
    assert "name" in capsys.readouterr().err
    assert main(["status", "job", "--redis", "http://nowhere"]) == 2
    assert "--redis" in capsys.readouterr().err


def test_chaos_is_delegated(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("redlease.tools.chaos.__main__")

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 4

    fake.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "redlease.tools.chaos.__main__", fake)
    assert main(["chaos", "--seed", "3", "--quick"]) == 4
    assert seen == [["--seed", "3", "--quick"]]


def test_chaos_missing_is_explained(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "redlease.tools.chaos.__main__", None)
    assert main(["chaos"]) == 2
    assert "not available" in capsys.readouterr().err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


def _once_held(r: redis.Redis, key: str, then: Callable[[], object]) -> threading.Thread:
    """A thread that does ``then()`` 0.3 s after ``key`` exists (a lease taken away while
    the command runs): at a fixed time from the start, it came before the grant once on
    a loaded machine, and the command then ran its course under a lock nobody took."""

    def run() -> None:
        deadline = time.monotonic() + 30
        while not r.exists(key) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        then()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_run_kills_the_command_when_the_lease_is_lost(
    server: servers.ServerProcess, r: redis.Redis, name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    # Someone deletes the lock key behind our back (as an operator or a failover would).
    timer = _once_held(r, lock_key(name), lambda: r.delete(lock_key(name)))
    started = time.monotonic()
    argv = ["run", name, "--redis", server.url, "--ttl", "0.6", "--"]
    code = main([*argv, *_py("import time; time.sleep(20)")])
    timer.join()
    assert code == 75  # the lost code, whatever the command's (it was ended by SIGTERM)
    assert time.monotonic() - started < 10
    assert "lost lock" in capfd.readouterr().err


def test_run_semaphore_runs_at_most_n_copies(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    """Two permits: the command runs beside one holder, not beside two."""
    sem = redlease.Semaphore(r, name, 2, ttl=30.0)
    argv = ["run", name, "--redis", server.url, "--semaphore", "2", "--timeout", "0.2", "--"]
    with sem.acquire(timeout=1):
        assert main([*argv, *_py("pass")]) == 0
        with sem.acquire(timeout=1):
            assert main([*argv, *_py("raise SystemExit(7)")]) == 1  # busy: not run


def test_run_elect_runs_while_leading_and_stops_when_it_loses(
    server: servers.ServerProcess, r: redis.Redis, name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    probe = f"""
        import sys, redis, redlease
        e = redlease.Election(redis.Redis.from_url({server.url!r}), {name!r})
        sys.exit(0 if e.leader() is not None else 5)
    """
    assert main(["run", name, "--redis", server.url, "--elect", "--", *_py(probe)]) == 0
    assert redlease.Election(r, name).leader() is None  # resigned at the end
    assert "leading" in capfd.readouterr().err
    # leadership taken away while the command runs: it is stopped, and the exit says so
    keys = LockKeys.for_election(name)
    thief = _once_held(r, keys.lock, lambda: r.set(keys.lock, "someone-else", px=30_000))
    started = time.monotonic()
    sleeper = _py("import time; time.sleep(60)")
    code = main(["run", name, "--redis", server.url, "--elect", "--ttl", "0.6", "--", *sleeper])
    thief.join()
    assert code == 75
    assert time.monotonic() - started < 30
    assert "lost" in capfd.readouterr().err
    r.delete(keys.lock)
