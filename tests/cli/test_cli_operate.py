"""The operator's subcommands through a real process: ``inspect`` (who holds, how long,
the queue with dead entries told apart, exit codes), ``list`` (SCAN under the prefix)
and ``release --force`` (a dead job's lock freed, the next waiter served at once, the
fence still increasing, confirmation required)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import redis

import redlease
from redlease.tools import servers
from waiting_helpers import lock_key, queued, wait_until

pytestmark = pytest.mark.slow


def cli(*argv: str, url: str, stdin: str | None = None) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "redlease", *argv],
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "REDLEASE_URL": url},
    )
    return proc.returncode, proc.stdout, proc.stderr


def _kill_9_holder(url: str, name: str) -> str:
    """A job that took the lock (ttl 60 s) and was killed -9: its token."""
    code = textwrap.dedent(f"""
        import sys, time, redis, redlease
        lease = redlease.Lock(redis.Redis.from_url({url!r}), {name!r}, ttl=60.0).acquire()
        print(lease.token, flush=True)
        time.sleep(120)
    """)
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert job.stdout is not None
    token = job.stdout.readline().strip()
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=30)
    job.stdout.close()
    return token


def test_inspect_tells_held_from_free_and_live_waiters_from_dead_ones(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    code, out, _ = cli("inspect", name, url=server.url)
    assert code == 1
    assert f"lock {name!r}: free" in out
    holder = redlease.Lock(r, name, ttl=30.0).acquire()
    # a waiter that is alive, and one killed -9 while queued (its entry stays, dead)
    live = threading.Thread(target=lambda: redlease.Lock(r, name).acquire(timeout=30).release())
    live.start()
    wait_until(lambda: queued(r, name) == 1, 30)
    dead = textwrap.dedent(f"""
        import redis, redlease
        redlease.Lock(redis.Redis.from_url({server.url!r}), {name!r}, ttl=60).acquire()
    """)
    proc = subprocess.Popen([sys.executable, "-c", dead])
    wait_until(lambda: queued(r, name) == 2, 30)
    proc.kill()
    proc.wait(timeout=30)
    # its entry is good for its round (about its ttl, 60 s), but its hub is gone with it:
    # dead as soon as the server has seen its connection close, as a release would find
    wait_until(
        lambda: json.loads(cli("inspect", name, "--json", url=server.url)[1])["live_waiters"] == 1,
        30,
    )
    code, out, _ = cli("inspect", name, "--json", url=server.url)
    assert code == 0
    doc = json.loads(out)
    assert doc["held"] is True
    assert doc["fence"] == holder.fence
    (shown,) = doc["holders"]
    assert shown["token"] == holder.token[:8]  # never the whole token; no ellipsis in JSON
    assert shown["fence"] == holder.fence  # the fence the holder got
    assert 0 < shown["remaining"] <= 30
    assert shown["remaining"] == round(shown["remaining"], 3)  # seconds, to the ms
    assert all(w["remaining"] == round(w["remaining"], 3) for w in doc["waiters"])
    assert [w["live"] for w in doc["waiters"]] == [True, False]
    code, out, _ = cli("status", name, url=server.url)  # the old name, same answer
    assert code == 0
    assert "waiting: 1 (and 1 expired entries)" in out
    assert holder.token not in out
    holder.release()
    live.join(timeout=30)


def test_list_scans_the_prefix_for_what_is_held(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    odd = name + ":{braced}*"
    locks = [redlease.Lock(r, n, ttl=30.0).acquire() for n in (name + ":a", odd)]
    permits = [redlease.Semaphore(r, name + ":sem", 3, ttl=30.0).acquire() for _ in range(2)]
    redlease.Lock(r, name + ":free", ttl=30.0).acquire().release()  # leaves a fence counter
    r.set("unrelated:{" + name + "}", "x")  # not under the prefix
    code, out, _ = cli("list", name + ":*", "--json", url=server.url)
    assert code == 0
    rows = {(row["kind"], row["name"]): row for row in json.loads(out)}
    assert set(rows) == {("lock", name + ":a"), ("lock", odd), ("semaphore", name + ":sem")}
    assert len(rows[("semaphore", name + ":sem")]["holders"]) == 2
    code, out, _ = cli("list", name + ":*", "--kind", "semaphore", url=server.url)
    assert code == 0
    assert out.splitlines()[0].split("\t") == [
        "KIND",
        "NAME",
        "LEFT",
        "FENCE",
        "WAITING",
        "HOLDERS",
    ]
    assert [line.split("\t")[:2] for line in out.splitlines()[1:]] == [["semaphore", name + ":sem"]]
    for lease in (*locks, *permits):
        lease.release()
    code, out, err = cli("list", name + ":*", url=server.url)
    assert (code, out) == (1, "")  # nothing held: said on stderr, stdout stays empty
    assert err == f"redlease: no lock held under the prefix 'redlease:' matching '{name}:*'\n"
    code, out, err = cli("list", name + ":*", "--kind", "semaphore", "--json", url=server.url)
    assert (code, out.strip(), err) == (1, "[]", "")  # JSON: an empty list, nothing else


def test_output_cut_off_by_a_closed_pipe_ends_quietly(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    """``redlease list | head -1``: the reader goes away while redlease still writes; it
    ends as a program killed by SIGPIPE would (128 + 13), with no traceback."""
    with r.pipeline(transaction=False) as pipe:
        for n in range(3000):  # more lines than a pipe holds
            pipe.set(lock_key(f"{name}:{n}"), f"holder{n}", px=60_000)
        pipe.execute()
    proc = subprocess.Popen(
        [sys.executable, "-m", "redlease", "list", f"{name}:*"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "REDLEASE_URL": server.url},
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert proc.stdout.readline().startswith(b"KIND")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(60) == 128 + signal.SIGPIPE, err
    assert "Traceback" not in err
    assert err == ""


def test_release_force_frees_a_dead_jobs_lock_for_the_next_waiter(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    token = _kill_9_holder(server.url, name)
    lock = redlease.Lock(r, name, ttl=30.0)
    assert lock.try_acquire() is None  # the dead job's lease has a minute left
    before = int(r.get(lock_key(name) + ":fence") or 0)
    got: list[redlease.Lease] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=50)))
    waiter.start()
    wait_until(lambda: queued(r, name) == 1, 30)

    assert cli("release", name, url=server.url)[0] == 2  # --force is required
    code, _, err = cli("release", name, "--force", url=server.url)  # no terminal, no --yes
    assert code == 2
    assert "pass --yes" in err
    assert r.get(lock_key(name)) == token.encode()  # nothing was changed

    code, out, _ = cli("release", name, "--force", "--yes", url=server.url)
    assert code == 0
    said = rf"released lock {re.escape(repr(name))}: holder {token[:8]}… \(exclusive"
    assert re.search(said + rf", fence {before}\)", out)  # the dead holder's fence too
    assert token not in out
    waiter.join(timeout=30)  # served at once, not when the dead job's minute ran out
    (lease,) = got
    assert lease.fence > before  # fences keep increasing
    code, out, _ = cli("release", name, "--force", "--yes", "--json", url=server.url)
    assert code == 0  # now it is the waiter's lease that goes
    assert json.loads(out)["removed"][0]["token"] == lease.token[:8]
    with pytest.raises(redlease.LockLost):
        lease.release()
    code, out, _ = cli("release", name, "--force", "--yes", url=server.url)
    assert code == 1
    assert "free: nothing to release" in out


def test_release_force_asks_on_a_terminal(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    """A terminal is needed to ask; script(1) gives the command one."""
    if not os.path.exists("/usr/bin/script"):
        pytest.skip("script(1) is not installed")
    lease = redlease.Lock(r, name, ttl=30.0).acquire()
    command = f"{sys.executable} -m redlease release {name} --force --redis {server.url}"
    for answer, code, held in (("n", 2, True), ("y", 0, False)):
        proc = subprocess.run(
            ["/usr/bin/script", "-qec", command, "/dev/null"],
            input=answer + "\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == code, proc.stdout + proc.stderr
        assert f"Free lock {name!r}, held by {lease.token[:8]}…" in proc.stdout
        assert bool(r.exists(lock_key(name))) is held


@pytest.mark.parametrize("kind", ["semaphore", "rwlock", "election"])
def test_release_force_of_the_other_primitives(
    server: servers.ServerProcess, r: redis.Redis, name: str, kind: str
) -> None:
    lease: redlease.Lease
    if kind == "semaphore":
        lease = redlease.Semaphore(r, name, 2, ttl=30.0).acquire()
    elif kind == "rwlock":
        lease = redlease.ReadWriteLock(r, name, ttl=30.0).write.acquire()
    else:
        election = redlease.Election(r, name, ttl=30.0, identity="old-leader")
        lease = election.campaign()
    code, out, _ = cli("inspect", name, "--kind", kind, url=server.url)
    assert code == 0
    code, out, _ = cli("release", name, "--kind", kind, "--force", "--yes", url=server.url)
    assert code == 0, out
    assert lease.token[:8] in out
    code, out, _ = cli("inspect", name, "--kind", kind, url=server.url)
    assert code == 1
    if kind == "election":
        assert election.leader() is None
        election.resign()  # its lease is gone: nothing to hand over
    else:
        with pytest.raises(redlease.LockLost):
            lease.release()


def test_release_force_of_a_leader_tells_the_observers_at_once(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    """An election's observers hear of a forced release when it happens, not when the
    leader's lease (30 s here) would have run out."""
    election = redlease.Election(r, name, ttl=30.0, identity="old-leader")
    election.campaign()
    seen: list[object] = []

    def observe() -> None:
        with redlease.Election(r, name, ttl=30.0).observe() as observation:
            for leader in observation:
                seen.append(leader)
                if leader is None:
                    return

    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    wait_until(lambda: len(seen) == 1, timeout=10.0)
    assert seen[0] is not None
    code, out, _ = cli("release", name, "--kind", "election", "--force", "--yes", url=server.url)
    assert code == 0, out
    watcher.join(timeout=10.0)  # a third of the lease: only the announcement wakes it
    assert not watcher.is_alive()
    assert seen[-1] is None
    election.resign()


def test_operator_commands_refuse_bad_input(server: servers.ServerProcess) -> None:
    assert cli("inspect", "", url=server.url)[0] == 2
    code, _, err = cli("inspect", "x", "--prefix", "a{b", url=server.url)
    assert code == 2
    assert "prefix" in err
    code, _, err = cli("list", url="redis://127.0.0.1:1/0")
    assert code == 2
    assert "cannot reach the server" in err


def test_list_warns_of_a_key_of_another_type_and_lists_the_rest(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    """A key under the prefix that is not redlease's (a hash where a lock would be) is
    one warning line; everything else is listed (it failed the whole listing)."""
    r.hset(lock_key(name + ":odd"), "field", "value")
    r.pexpire(lock_key(name + ":odd"), 60_000)
    held = redlease.Lock(r, name + ":a", ttl=30.0).acquire()
    code, out, err = cli("list", name + ":*", url=server.url)
    assert code == 0, err
    assert [line.split("\t")[1] for line in out.splitlines()[1:]] == [name + ":a"]
    (warning,) = err.splitlines()
    assert warning.startswith(f"redlease: warning: lock '{name}:odd'"), warning
    assert "another type" in warning
    assert "@user_script" not in warning  # (the script's own lines say nothing to a reader)
    code, out, err = cli("list", name + ":*", "--json", url=server.url)
    assert code == 0, err
    assert [row["name"] for row in json.loads(out)] == [name + ":a"]
    assert json.loads(err)["event"] == "warning"
    held.release()


def test_inspect_json_says_an_error_as_json(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    r.hset(lock_key(name), "field", "value")
    r.pexpire(lock_key(name), 60_000)
    code, out, err = cli("inspect", name, "--json", url=server.url)
    assert (code, out) == (2, "")
    said = json.loads(err)
    assert (said["event"], said["code"]) == ("error", 2)
    assert "another type" in said["message"]
    assert "@user_script" not in said["message"]


def test_inspect_shows_a_scheduled_jobs_period(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    """A job run with --every whose period has run is free, but its next run waits for
    the next period: inspect says so (it said only "free")."""
    code, _, err = cli("run", name, "--every", "1h", "--ttl", "10", "--", "true", url=server.url)
    assert code == 0, err
    code, out, _ = cli("inspect", name, url=server.url)
    assert code == 1  # (free)
    assert "run of this period began" in out.splitlines()[0], out
    code, out, _ = cli("inspect", name, "--json", url=server.url)
    period = json.loads(out)["period"]
    assert 0 < period["next_in"] <= 3600
    assert len(period["run"]) == 8
    skipped, _, err = cli("run", name, "--every", "1h", "--ttl", "10", "--", "true", url=server.url)
    assert skipped == 1, err  # (what inspect foretold)


def test_inspect_with_a_period_key_of_another_type(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    r.rpush(lock_key(name) + ":once", "x")
    r.pexpire(lock_key(name) + ":once", 60_000)
    code, out, err = cli("inspect", name, url=server.url)
    assert (code, err) == (1, ""), err  # free, and no period: nothing else to say
    assert out.startswith(f"lock {name!r}: free\n"), out
