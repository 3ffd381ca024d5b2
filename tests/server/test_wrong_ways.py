"""The wrong ways of SPEC section 2 fail, each in the way the articles explain, and
redlease passes the same checks. Real servers, real processes; failures are made
deterministic by pausing a client exactly inside the window that makes a design wrong."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
import redis

import redlease
from redlease.tools import broken, servers
from redlease.tools.chaos.workload import WorkloadConfig, run_counter_workload
from waiting_helpers import lock_key


@pytest.mark.parametrize("contender", ["none", "redlease"])
def test_counter_workload_many_processes(server: servers.ServerProcess, contender: str) -> None:
    result = run_counter_workload(
        WorkloadConfig(server.url, contender, name="rmw", processes=4, iterations=25, work=0.003)
    )
    assert result.completed == 100
    if contender == "none":
        assert result.lost_updates > 0  # the workload does detect races
        assert result.overlaps()
    else:
        assert result.lost_updates == 0
        assert result.overlaps() == []
        assert result.keys_without_ttl == []


def _crash_between_setnx_and_expire(url: str, contender: str) -> None:
    """A holder process that dies right after taking the lock (SIGKILL, no clean-up)."""
    code = textwrap.dedent(f"""
        import os, signal, redis
        from redlease.tools import broken
        client = redis.Redis.from_url({url!r})
        def die():
            os.kill(os.getpid(), signal.SIGKILL)
        if {contender!r} == "setnx-expire":
            broken.SetnxThenExpire(client, "crash", 1.0, between=die).acquire(5)
        else:
            broken.RedleaseContender(client, "crash", 1.0).acquire(5)
            die()
    """)
    proc = subprocess.run([sys.executable, "-c", code], timeout=60, check=False)
    assert proc.returncode == -9


def test_setnx_then_expire_crash_leaves_a_lock_without_ttl(
    server: servers.ServerProcess, r: redis.Redis
) -> None:
    _crash_between_setnx_and_expire(server.url, "setnx-expire")
    assert r.pttl("broken:crash") == -1  # no TTL: a deadlock forever
    assert broken.SetnxThenExpire(r, "crash", 1.0).acquire(1.5) is None


def test_redlease_holder_crash_frees_the_lock_after_its_ttl(
    server: servers.ServerProcess, r: redis.Redis
) -> None:
    _crash_between_setnx_and_expire(server.url, "redlease")
    assert 0 < r.pttl(lock_key("crash")) <= 1000
    lease = redlease.Lock(r, "crash", ttl=1.0).acquire(timeout=10)
    lease.release()


def test_getset_timestamp_trusts_client_clocks(r: redis.Redis) -> None:
    honest = broken.GetsetTimestamp(r, "clock", 5.0)
    fast = broken.GetsetTimestamp(r, "clock", 5.0, clock=lambda: time.time() + 60)
    first = honest.acquire(1)
    assert first is not None
    # A client whose clock runs a minute ahead thinks the lock expired and takes it.
    second = fast.acquire(1)
    assert second is not None  # two holders at once
    # ...and the honest holder's release deletes the other's lock: no owner check.
    first.release()
    assert r.exists("broken:clock") == 0


def test_plain_del_releases_the_next_holders_lock(r: redis.Redis) -> None:
    lock = broken.PlainDel(r, "del", 0.1)
    a = lock.acquire(1)
    assert a is not None
    time.sleep(0.2)  # a pauses past its lease
    b = lock.acquire(1)
    assert b is not None
    a.release()  # a's late DEL removes b's lock...
    c = lock.acquire(0.5)
    assert c is not None  # ...so c holds it while b still believes it does


def test_get_then_del_races_between_the_two_commands(r: redis.Redis) -> None:
    others: list[broken.Held | None] = []

    def pause_until_lock_changes_hands() -> None:
        time.sleep(0.2)  # the lease runs out between GET and DEL...
        others.append(broken.GetThenDel(r, "getdel", 5.0).acquire(1))

    a = broken.GetThenDel(r, "getdel", 0.1, between=pause_until_lock_changes_hands).acquire(1)
    assert a is not None
    a.release()
    assert others[0] is not None  # ...b took the lock...
    c = broken.GetThenDel(r, "getdel", 5.0).acquire(0.5)
    assert c is not None  # ...and a's DEL freed it under b: c holds it too


def test_redlease_refuses_each_of_those_races(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=0.1)
    a = lock.acquire(timeout=1)
    time.sleep(0.2)  # a pauses past its lease
    b = lock.acquire(timeout=1)
    with pytest.raises(redlease.LockLost):
        a.release()  # atomic compare-and-delete: b's lock is untouched
    assert lock.try_acquire() is None
    assert b.fence > a.fence  # and a resource checking fences rejects a's late writes
    b.release()
