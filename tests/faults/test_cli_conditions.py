"""The operator's CLI under production network conditions, through real processes and
real servers: an idle timeout on the server (``timeout 1``), its connections killed
(``CLIENT KILL``), a restart that loses the data, a stopped server, and a slow link (a
TCP proxy adding latency). ``run`` must keep its lease through the first two, report a
lost one (exit 75) after the third, and ``inspect``/``list``/``release --force`` must
give the same answers as on a quiet loopback.

The CLI is given a ``valkey://`` URL on Valkey (a valkey-py client) and ``redis://`` on
Redis (redis-py), so each family meets these conditions. Every server broken or
configured specially here is the test's own.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import families
import redlease
from cli_helpers import finish, start
from families import ClientFamily
from redlease.tools import servers
from redlease.tools.chaos.proxy import FaultProxy
from waiting_helpers import in_thread, lock_key, queued, wait_until

pytestmark = pytest.mark.slow

# Redis and Valkey count idleness in whole seconds: `timeout 1` closes a connection once it
# has been idle for 1 to 2 s. Renewals a third of 9 s apart leave the renewer's connection
# idle for 3 s, so each renewal meets a connection the server has closed.
IDLE_TTL = "9"
IDLE_CLOSED = "Closing idle client"  # the server's log line (at --loglevel verbose)


def _url(port: int, family: ClientFamily) -> str:
    scheme = "valkey" if family.name == "valkey-py" else "redis"
    return f"{scheme}://127.0.0.1:{port}/0"


def _start(url: str, *argv: str) -> subprocess.Popen[str]:
    return start(list(argv), REDLEASE_URL=url)


def cli(url: str, *argv: str) -> tuple[int, str, str]:
    return finish(_start(url, *argv))


def _events(err: str) -> list[dict[str, Any]]:
    """``run --json``'s own messages (stderr may also carry a warning in plain text)."""
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def _short(token: str) -> str:
    """A token as JSON shows it: its first 8 characters, nothing added."""
    return token[:8]


@contextlib.contextmanager
def _running(url: str, name: str, tmp_path: Path, *options: str) -> Iterator[_Run]:
    """``redlease run NAME --json [options] -- CMD``; CMD prints its fence, then waits for
    the test to open its gate. Whatever happens, the gate is opened and the run reaped
    (CMD runs in a process group of its own: it would outlive a killed run)."""
    gate = tmp_path / f"gate-{name.replace(':', '-')}"
    cmd = f'echo "$REDLEASE_FENCE"; while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.05; done'
    proc = _start(url, "run", name, "--json", *options, "--", "sh", "-c", cmd)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the lease was granted and CMD started
        assert line.strip().isdigit(), (line, proc.stderr.read() if proc.stderr else "")
        yield _Run(proc, gate, int(line))
    finally:
        gate.touch()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


class _Run:
    def __init__(self, proc: subprocess.Popen[str], gate: Path, fence: int) -> None:
        self.proc = proc
        self.gate = gate
        self.fence = fence

    def end(self, *, open_gate: bool = True) -> tuple[int, list[dict[str, Any]], str]:
        """Until the run has exited (CMD let finish, unless ``open_gate`` is false): its
        exit code, its events and its stderr."""
        if open_gate:
            self.gate.touch()
        code, _, err = finish(self.proc)
        return code, _events(err), err


def _holder(port: int, name: str) -> str | None:
    """The token holding ``name``, read over a fresh connection."""
    with families.client(port=port) as fresh:
        value = fresh.get(lock_key(name))
        return None if value is None else bytes(value).decode()


@pytest.fixture
def idle_server(binary: servers.ServerBinary) -> Iterator[servers.ServerProcess]:
    """A server closing client connections idle for more than 1 s, logging when it does."""
    extra = ["--timeout", "1", "--loglevel", "verbose"]
    with servers.ServerProcess(binary, extra_args=extra) as proc:
        yield proc


@pytest.fixture
def own_server(binary: servers.ServerBinary) -> Iterator[servers.ServerProcess]:
    """A plain server this test may break."""
    with servers.ServerProcess(binary) as proc:
        yield proc


def _idle_closures(server: servers.ServerProcess) -> int:
    return (Path(server.workdir) / "server.log").read_text().count(IDLE_CLOSED)


def _renewed_after_now(port: int, name: str, timeout: float = 15.0) -> None:
    """Until the lease's PTTL goes back up: a renewal sent after this call was made.
    (Polling keeps this client busy, so it is never the one the server closes.)"""
    with families.client(port=port) as poller:
        last = int(poller.pttl(lock_key(name)))
        deadline = time.monotonic() + timeout
        while True:
            now = int(poller.pttl(lock_key(name)))
            assert now > 0, "the lease ran out: it was not renewed"
            if now > last + 200:
                return
            last = now
            assert time.monotonic() < deadline, "no renewal"
            time.sleep(0.02)


# -- 1. an idle timeout on the server (`timeout 1`) -------------------------------------------


def test_idle_timeout_run_keeps_its_lease_and_inspect_and_list_see_it(
    idle_server: servers.ServerProcess, family: ClientFamily, name: str, tmp_path: Path
) -> None:
    url = _url(idle_server.port, family)
    with _running(url, name, tmp_path, "--ttl", IDLE_TTL) as run:
        token = _holder(idle_server.port, name)
        assert token is not None
        # the run's connection sat idle past the timeout and was closed under it; a
        # renewal after that had to come over a new one
        wait_until(lambda: _idle_closures(idle_server) >= 1, 15)
        _renewed_after_now(idle_server.port, name)
        assert _holder(idle_server.port, name) == token

        # (at once: each is a Python start-up; `status` is inspect's other name)
        reading = _start(url, "status", name, "--json")
        listing = _start(url, "list", name, "--json")
        code, out, err = finish(reading)
        assert code == 0, err
        doc = json.loads(out)
        assert (doc["held"], doc["fence"]) == (True, run.fence)
        (shown,) = doc["holders"]
        assert shown["token"] == _short(token)
        assert 0 < shown["remaining"] <= float(IDLE_TTL)
        code, out, err = finish(listing)
        assert code == 0, err
        assert [(row["name"], row["fence"]) for row in json.loads(out)] == [(name, run.fence)]

        code, events, err = run.end()
    assert code == 0, err
    assert [e["event"] for e in events] == ["acquired", "exit"]
    assert events[-1]["lost"] is False
    assert _holder(idle_server.port, name) is None  # released
    assert cli(url, "inspect", name)[0] == 1  # free


def test_idle_timeout_force_release_is_noticed_by_the_run(
    idle_server: servers.ServerProcess, family: ClientFamily, name: str, tmp_path: Path
) -> None:
    """The run learns of the release at its next renewal, which meets a connection the
    server has closed: it must reconnect and hear "not yours" (and stop CMD), not take
    the failure for a passing fault and only notice when the lease runs out."""
    url = _url(idle_server.port, family)
    # Renewed 10 s after the grant. A renewal that took the closed connection for a
    # passing fault would try again a quarter of the time left later (15 s), and a run
    # that only noticed the end of its lease would go on to 30 s.
    ttl = 30.0
    with _running(url, name, tmp_path, "--ttl", str(ttl), "--grace", "1s") as run:
        token = _holder(idle_server.port, name)
        assert token is not None
        code, out, err = cli(url, "release", name, "--force", "--yes", "--json")
        assert code == 0, err
        released = time.monotonic()  # (the grant was earlier: the bound below is generous)
        assert [x["token"] for x in json.loads(out)["removed"]] == [_short(token)]
        code, events, err = run.end(open_gate=False)
    # told at the first renewal (10 s after the grant), not at a retry (15 s) or the end
    assert time.monotonic() - released < ttl / 3 + ttl / 12
    assert code == 75, err
    lost = next(e for e in events if e["event"] == "lost")
    assert lost["stopping"] is True  # CMD was stopped, though its gate never opened
    assert "no longer ours" in lost["reason"]  # what happened: the server said so
    assert events[-1] == {"event": "exit", "name": name, "code": 75, "lost": True}
    assert _holder(idle_server.port, name) is None
    assert _idle_closures(idle_server) >= 1  # (the run's was the only lasting connection)


# -- 2. the CLI's connections killed (`CLIENT KILL`) while `run` holds the lock ----------------


def _kill_other_clients(port: int) -> int:
    """`CLIENT KILL` every connection on the server but the one doing the killing."""
    with families.client(port=port) as admin:
        own = int(admin.client_id())
        return sum(
            int(admin.client_kill_filter(_id=entry["id"]))
            for entry in admin.client_list()
            if int(entry["id"]) != own
        )


def test_client_kill_during_run_keeps_the_lease(
    own_server: servers.ServerProcess, family: ClientFamily, name: str, tmp_path: Path
) -> None:
    """Killed again and again for longer than the ttl, the run's connections are replaced
    at each renewal: the lease is kept, and released when CMD ends (exit 0)."""
    url = _url(own_server.port, family)
    with _running(url, name, tmp_path, "--ttl", "2") as run:
        token = _holder(own_server.port, name)
        assert token is not None
        # kill for longer than the ttl: only renewals over new connections keep it
        killed, until = 0, time.monotonic() + 3.0
        while time.monotonic() < until:
            killed += _kill_other_clients(own_server.port)
            time.sleep(0.2)
        assert killed >= 2  # the run's connections were among them, more than once
        assert _holder(own_server.port, name) == token
        code, events, err = run.end()
    assert code == 0, err
    assert [e["event"] for e in events] == ["acquired", "exit"]
    assert events[-1]["lost"] is False
    assert _holder(own_server.port, name) is None  # released, over a new connection


# -- 3. a restart that loses the data, and a stopped server -----------------------------------


@pytest.mark.parametrize("after", ["gone", "taken"])
def test_restart_without_data_is_a_lost_lease(
    own_server: servers.ServerProcess,
    family: ClientFamily,
    name: str,
    tmp_path: Path,
    after: str,
) -> None:
    """The documented outcome: CMD stopped, exit 75. The run never takes the lock back,
    and never releases the lock of whoever took it after the restart ("taken"), whose
    fence is still greater (the server's clock rule)."""
    url = _url(own_server.port, family)
    port = own_server.port
    client = families.client(port=port)
    try:
        with _running(url, name, tmp_path, "--ttl", "2", "--grace", "1s") as run:
            assert _holder(port, name) is not None
            own_server.restart()  # SIGKILL and a start on the same port, with no data
            newcomer = None
            if after == "taken":
                newcomer = redlease.Lock(client, name, ttl=30.0).try_acquire()
                assert newcomer is not None  # nothing of the old lease is left
                assert newcomer.fence > run.fence
            code, events, err = run.end(open_gate=False)
        assert code == 75, err
        lost = next(e for e in events if e["event"] == "lost")
        assert lost["stopping"] is True
        assert events[-1] == {"event": "exit", "name": name, "code": 75, "lost": True}
        code, out, err = cli(url, "inspect", name, "--json")
        if newcomer is None:
            assert code == 1, err
            assert _holder(port, name) is None
        else:
            assert code == 0, err
            assert [h["token"] for h in json.loads(out)["holders"]] == [_short(newcomer.token)]
            newcomer.release()  # still its own: LockLost here would mean the run freed it
    finally:
        client.close()


def test_a_server_stopped_for_good(
    own_server: servers.ServerProcess, family: ClientFamily, name: str, tmp_path: Path
) -> None:
    """A run holding a lock on it reports the lost lease (75, as documented for a server
    out of reach; its release, which cannot reach the server either, used to turn that
    into 2). The other commands exit 2 with one line naming the server, not a traceback,
    and a new run never starts CMD."""
    port = own_server.port
    url = _url(port, family)
    with _running(url, name, tmp_path, "--ttl", "2", "--grace", "1s") as run:
        own_server.kill()
        code, events, err = run.end(open_gate=False)
    assert code == 75, err
    assert [e["event"] for e in events] == ["acquired", "lost", "exit"]
    assert events[-1] == {"event": "exit", "name": name, "code": 75, "lost": True}
    assert events[1]["stopping"] is True
    assert "validity ran out" in events[1]["reason"]  # not "taken over": out of reach

    ran = tmp_path / "ran"
    commands = [
        ("inspect", name),
        ("list",),
        ("release", name, "--force", "--yes"),
        ("run", name, "--", "touch", str(ran)),
    ]
    procs = [_start(url, *argv) for argv in commands]  # at once: each is a Python start-up
    for argv, proc in zip(commands, procs, strict=True):
        code, out, err = finish(proc)
        assert code == 2, (argv, out, err)
        assert out == ""
        assert "Traceback" not in err
        (line,) = [x for x in err.splitlines() if x.startswith("redlease:")]
        assert line.startswith("redlease: cannot reach the server"), (argv, err)
        assert f"127.0.0.1:{port}" in line, (argv, err)
    assert not ran.exists()


# -- 4. a slow link (50 ms each way) ----------------------------------------------------------


@pytest.fixture
def slow_link(server: servers.ServerProcess, r: redis.Redis) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", server.port).start() as proxy:
        proxy.set_mode("delay", delay_ms=50)
        yield proxy


def test_operator_commands_over_a_slow_link(
    r: redis.Redis, slow_link: FaultProxy, family: ClientFamily, name: str
) -> None:
    url = _url(slow_link.port, family)
    holder = redlease.Lock(r, name, ttl=60.0).acquire()
    waiter, got = in_thread(lambda: redlease.Lock(r, name, ttl=30.0).acquire(timeout=90))
    try:
        wait_until(lambda: queued(r, name) == 1, 30)

        started = time.monotonic()
        reading = _start(url, "inspect", name, "--json")  # (at once: both only read)
        listing = _start(url, "list", name, "--json")
        code, out, err = finish(reading)
        # (a lower bound: the link was slow, at least one round trip of 2 x 50 ms)
        assert time.monotonic() - started >= 0.1
        assert code == 0, err
        doc = json.loads(out)
        assert (doc["held"], doc["fence"]) == (True, holder.fence)
        assert [h["token"] for h in doc["holders"]] == [_short(holder.token)]
        assert 0 < doc["holders"][0]["remaining"] <= 60
        assert [w["live"] for w in doc["waiters"]] == [True]
        code, out, err = finish(listing)
        assert code == 0, err
        rows = json.loads(out)
        assert [(row["name"], row["fence"], row["live_waiters"]) for row in rows] == [
            (name, holder.fence, 1)
        ]

        code, out, err = cli(url, "release", name, "--force", "--yes", "--json")
        assert code == 0, err
        assert [x["token"] for x in json.loads(out)["removed"]] == [_short(holder.token)]
        waiter.join(timeout=20)  # served now, not when the holder's minute ran out
        (lease,) = got
        assert isinstance(lease, redlease.Lease), lease
        assert lease.fence > holder.fence
        assert r.get(lock_key(name)) == lease.token.encode()
        with pytest.raises(redlease.LockLost):
            holder.release()
        lease.release()

        assert cli(url, "list", name, "--json")[:2] == (1, "[]\n")  # nothing held
    finally:
        # (after a failure: free the waiter now rather than after the holder's minute)
        with contextlib.suppress(redlease.LockError):
            holder.release()
        waiter.join(timeout=60)
        for made in got:
            if isinstance(made, redlease.Lease):
                with contextlib.suppress(redlease.LockError):
                    made.release()
