"""``redlease run --at-least / --every``: a cron entry on several hosts runs its command
once. Through real processes: a skipped run exits with the conflict code and never runs
the command; the name stays held for --at-least after the command's start by the server's
clock, after redlease has exited; --every makes one run per period."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from cli_helpers import finish, start
from redlease.tools import servers
from waiting_helpers import lock_key

pytestmark = pytest.mark.slow


def test_a_run_holds_the_name_for_at_least_after_it_started_and_others_skip(
    server: servers.ServerProcess, r: redis.Redis, name: str, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    cmd = ["sh", "-c", f'echo "$REDLEASE_FENCE" >> {ran}']
    # at_least covers the two skipped runs after it: starting a process takes seconds
    # on a loaded machine
    job = ["run", name, "--ttl", "30s", "--at-least", "10s"]
    code, _, err = finish(start([*job, "-n", "--", *cmd], REDLEASE_URL=server.url))
    assert code == 0, err
    assert int(ran.read_text()) > 0
    left = r.pttl(lock_key(name))
    assert 0 < left <= 10_000  # redlease has exited; the server keeps the name
    code, _, err = finish(start([*job, "--", *cmd], REDLEASE_URL=server.url))
    assert code == 1
    assert f"scheduled job {name!r} skipped: running" in err
    code, _, _ = finish(start([*job, "-E", "9", "--", *cmd], REDLEASE_URL=server.url))
    assert code == 9
    assert len(ran.read_text().split()) == 1  # neither skipped run ran the command
    time.sleep(r.pttl(lock_key(name)) / 1000 + 0.05)
    code, _, _ = finish(start([*job, "--", *cmd], REDLEASE_URL=server.url))
    assert code == 0
    assert len(ran.read_text().split()) == 2


def test_hosts_firing_at_once_run_the_command_once(
    server: servers.ServerProcess, name: str, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    cmd = ["sh", "-c", f"echo x >> {ran}; sleep 0.2"]
    job = ["run", name, "--ttl", "30s", "--at-least", "5s", "-n", "--", *cmd]
    hosts = [start(job, REDLEASE_URL=server.url) for _ in range(4)]
    codes = sorted(finish(host)[0] for host in hosts)
    assert codes == [0, 1, 1, 1]
    assert ran.read_text().split() == ["x"]


def test_every_runs_once_per_period(
    server: servers.ServerProcess, name: str, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    cmd = ["sh", "-c", f"echo x >> {ran}"]
    argv = ["run", name, "--ttl", "1m", "--every", "1h", "--", *cmd]
    assert finish(start(argv, REDLEASE_URL=server.url))[0] == 0
    code, _, err = finish(start(argv, REDLEASE_URL=server.url))
    assert code == 1
    assert "skipped: ran this period" in err
    assert ran.read_text().split() == ["x"]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--at-least", "1m", "--ttl", "30s"], "--at-least must not exceed --ttl"),
        (["--every", "1m", "--ttl", "1m", "-w", "5"], "never waits"),
        (["--every", "1m", "--ttl", "1m", "--semaphore", "2"], "take one server, and a lock"),
        (["--at-least", "1s", "--ttl", "1m", "--elect"], "take one server, and a lock"),
        (["--every", "1h"], "needs --ttl"),
        (["--every", "0"], "positive"),
    ],
)
def test_what_a_scheduled_run_refuses(
    server: servers.ServerProcess, name: str, options: list[str], said: str
) -> None:
    code, out, err = finish(
        start(["run", name, *options, "--", "echo", "ran"], REDLEASE_URL=server.url)
    )
    assert code == 2
    assert out == ""
    assert said in err


def test_a_skip_in_json_says_why(server: servers.ServerProcess, name: str) -> None:
    argv = ["run", name, "--ttl", "1m", "--every", "1h", "--json", "--", "true"]
    assert finish(start(argv, REDLEASE_URL=server.url))[0] == 0
    code, _, err = finish(start(argv, REDLEASE_URL=server.url))
    assert code == 1
    said = json.loads(err.splitlines()[-1])
    assert (said["event"], said["reason"]) == ("busy", "ran this period")
    assert 0 < said["retry_in"] <= 3600


def test_a_command_that_never_started_does_not_use_up_the_period(
    server: servers.ServerProcess, name: str, tmp_path: Path
) -> None:
    argv = ["run", name, "--ttl", "1m", "--every", "1h", "--json", "--"]
    code, _, err = finish(start([*argv, str(tmp_path / "missing")], REDLEASE_URL=server.url))
    assert code == 127, err
    events = {line["event"]: line for line in map(json.loads, err.splitlines())}
    assert "cannot run" in events["error"]["message"]  # why, in the JSON too
    ran = tmp_path / "ran"
    code, _, err = finish(start([*argv, "sh", "-c", f"echo x > {ran}"], REDLEASE_URL=server.url))
    assert code == 0, err  # the period was given back: this one runs
    assert ran.read_text() == "x\n"
