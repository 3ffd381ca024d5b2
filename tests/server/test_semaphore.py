"""``Semaphore`` and ``AsyncSemaphore`` on real servers: at most ``limit`` permits, each a
lease of its own (token, fence, ttl, extend, release, renewal), waiters served in arrival
order, a dead holder's permit running out on its own, a dead waiter skipped, a cancelled
waiter's permit given back, limits changed under holders, keys apart from the lock's and
all with a TTL; and the invariant across processes sharing a resource."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import redlease
from redlease._rules.flows import acquire_reply
from redlease._rules.keys import LockKeys, forgotten_within
from redlease._rules.scripts import SHARED_ACQUIRE
from redlease.tools import servers
from waiting_helpers import lock_key, until_queued, wait_until


def keys_of(name: str) -> LockKeys:
    return LockKeys.for_semaphore(name)


def queued(r: redis.Redis, name: str) -> int:
    return int(r.llen(keys_of(name).queue))


def sem_keys(r: redis.Redis, name: str) -> list[bytes]:
    return list(r.scan_iter(match=keys_of(name).lock.replace("{", "[{]") + "*"))


def test_at_most_limit_permits_each_a_lease_of_its_own(twin: Any, name: str) -> None:
    sem = twin.semaphore(name, 3, ttl=30.0)
    permits = [sem.acquire(timeout=1) for _ in range(3)]
    assert sem.try_acquire() is None
    with pytest.raises(redlease.AcquireTimeout, match="semaphore"):
        sem.acquire(timeout=0.1)
    assert len({p.token for p in permits}) == 3
    fences = [p.fence for p in permits]
    assert fences == sorted(fences)
    assert len(set(fences)) == 3
    for p in permits:
        assert 0 < p.remaining() <= 30.0
        p.check()
        p.extend(20.0)
    permits[1].release()
    again = sem.try_acquire()
    assert again is not None
    assert again.fence > max(fences)
    for p in (permits[0], permits[2], again):
        p.release()
    with sem as permit:
        assert permit.fence > again.fence


def test_waiters_are_served_in_arrival_order(twin: Any, r: redis.Redis, name: str) -> None:
    sem = twin.semaphore(name, 2, ttl=30.0)
    held = [sem.acquire(timeout=1), sem.acquire(timeout=1)]
    got: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def waiter(i: int) -> None:
        try:
            permit = sem.acquire(timeout=60)
            got.append((permit.fence, i))
            permit.release()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = []
    for i in range(5):
        threads.append(threading.Thread(target=waiter, args=(i,)))
        threads[-1].start()
        wait_until(lambda i=i: queued(r, name) == i + 1)  # queued before the next comes
    for p in held:
        p.release()
    for t in threads:
        t.join(60)
    assert errors == []
    assert [i for _, i in sorted(got)] == [0, 1, 2, 3, 4]  # granted (fenced) in order


def test_a_dead_holders_permit_runs_out_on_its_own(twin: Any, name: str) -> None:
    sem = twin.semaphore(name, 1, ttl=0.3)
    abandoned = sem.acquire(timeout=1)  # never released: its holder "crashed"
    started = time.monotonic()
    permit = sem.acquire(timeout=20)
    assert time.monotonic() - started < 15  # woken by the expiry, not by the timeout
    assert permit.fence > abandoned.fence
    with pytest.raises(redlease.LockLost):
        abandoned.extend()
    permit.release()


def test_a_lost_permit_is_told(twin: Any, name: str) -> None:
    lost: list[object] = []
    sem = twin.semaphore(name, 2, ttl=0.2, on_lost=lost.append)
    permit = sem.acquire(timeout=1)
    time.sleep(0.4)
    assert permit.lost
    with pytest.raises(redlease.LockLost):
        permit.check()
    with pytest.raises(redlease.LockLost):
        permit.release()
    assert len(lost) == 1


def test_auto_renew_keeps_a_permit(twin: Any, r: redis.Redis, name: str) -> None:
    # (a ttl of 1 s: a renewal a third in, so a stall of 0.6 s on a loaded machine
    # still leaves it in time)
    sem = twin.semaphore(name, 1, ttl=1.0, auto_renew=True)
    with sem as permit:
        time.sleep(2.5)  # two and a half ttls
        assert not permit.lost
        assert r.zscore(keys_of(name).lock, permit.token) is not None
        assert sem.try_acquire() is None


def test_limit_changes_never_revoke_a_holder(twin: Any, name: str) -> None:
    two = twin.semaphore(name, 2, ttl=30.0)
    held = [two.acquire(timeout=1), two.acquire(timeout=1)]
    three = twin.semaphore(name, 3, ttl=30.0)  # raised: one more permit
    third = three.try_acquire()
    assert third is not None
    assert two.try_acquire() is None  # the old limit still counts all three
    one = twin.semaphore(name, 1, ttl=30.0)  # lowered below the holders
    assert one.try_acquire() is None
    for p in held:
        p.extend()  # nobody was revoked
    held[0].release()
    held[1].release()
    assert one.try_acquire() is None  # still one held, the new limit's worth
    third.release()
    last = one.try_acquire()
    assert last is not None
    last.release()


def test_every_key_has_a_ttl_and_none_outlives_its_bound(
    twin: Any, r: redis.Redis, name: str
) -> None:
    # (a lease of 1.5 s outlasts the checks below on a loaded machine; 0.5 s did not)
    sem = twin.semaphore(name, 1, ttl=1.5)
    permit = sem.acquire(timeout=1)
    waiter = threading.Thread(target=lambda: sem.acquire(timeout=10).release())
    waiter.start()
    wait_until(lambda: queued(r, name) == 1)
    keys = sem_keys(r, name)
    assert len(keys) >= 4  # holders, fences, counter, queue
    assert all(r.pttl(k) > 0 for k in keys), {k: r.pttl(k) for k in keys}
    permit.release()
    waiter.join(30)
    assert all(r.pttl(k) > 0 for k in sem_keys(r, name))
    time.sleep(forgotten_within(1500) / 1000 + 0.2)
    assert sem_keys(r, name) == []


def test_a_lock_and_a_semaphore_of_one_name_are_apart(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    sem = redlease.Semaphore(r, name, 1, ttl=30.0)
    with lock as lease, sem as permit:
        assert r.get(lock_key(name)) == lease.token.encode()
        assert r.zscore(keys_of(name).lock, permit.token) is not None
        assert not set(LockKeys.for_name(name).script_keys) & set(keys_of(name).script_keys)


def test_a_dead_waiter_is_skipped_at_once(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    sem = redlease.Semaphore(r, name, 1, ttl=30.0)
    held = sem.acquire(timeout=1)
    code = textwrap.dedent(f"""
        import redis, redlease
        r = redis.Redis.from_url({server.url!r})
        redlease.Semaphore(r, {name!r}, 1, ttl=30.0).acquire(timeout=60)
    """)
    dead = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_until(lambda: queued(r, name) == 1, timeout=60)
    finally:
        dead.kill()  # -9 while queued: its entry stays for the ttl (30 s)
        dead.wait(30)
    got: list[float] = []

    def wait() -> None:
        sem.acquire(timeout=60).release()
        got.append(time.monotonic())

    waiting = threading.Thread(target=wait)
    waiting.start()
    wait_until(lambda: queued(r, name) == 2)
    released = time.monotonic()
    held.release()
    waiting.join(60)
    assert len(got) == 1
    assert got[0] - released < 10  # well inside the dead entry's 30 s


async def test_a_cancelled_waiter_leaves_no_permit_behind(
    ar: aredis.Redis, r: redis.Redis, name: str
) -> None:
    sem = redlease.AsyncSemaphore(ar, name, 1, ttl=30.0)
    for _ in range(3):
        holder = await sem.acquire(timeout=1)
        waiter = asyncio.ensure_future(sem.acquire(timeout=30))
        await until_queued(lambda: queued(r, name))
        await holder.release()  # granted to the waiter on the server...
        waiter.cancel()  # ...which is cancelled before it hears of it
        with pytest.raises(asyncio.CancelledError):
            await waiter
        again = await sem.try_acquire()  # so it was given back
        assert again is not None
        await again.release()
    assert r.zcard(keys_of(name).lock) == 0


def test_bad_arguments_are_named(r: redis.Redis, ar: aredis.Redis, name: str) -> None:
    for limit in (0, -1, "3", 2.0, True, None, 10**6):
        with pytest.raises(redlease.InvalidArgument, match="limit"):
            redlease.Semaphore(r, name, limit)  # type: ignore[arg-type]
    with pytest.raises(redlease.InvalidArgument, match="ttl"):
        redlease.Semaphore(r, name, 2, ttl=0)
    with pytest.raises(redlease.InvalidArgument, match="AsyncSemaphore"):
        redlease.AsyncSemaphore(r, name, 2)
    with pytest.raises(redlease.InvalidArgument, match="use AsyncSemaphore"):
        redlease.Semaphore(ar, name, 2)
    assert sem_keys(r, name) == []


def test_a_foreign_key_is_named(r: redis.Redis, name: str) -> None:
    r.set(keys_of(name).lock, "not a sorted set", ex=60)
    with pytest.raises(redlease.LockError, match=r"semaphore .* holds a string"):
        redlease.Semaphore(r, name, 2).try_acquire()


_WORKER = """
import json, sys, time, redis, redlease
port, name, limit, seconds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
r = redis.Redis(port=port)
sem = redlease.Semaphore(r, name, limit, ttl=10.0)
most, over, fences = 0, 0, []
end = time.monotonic() + seconds
while time.monotonic() < end:
    with sem.acquire(timeout=60) as permit:
        inside = r.incr(name + ":inside")  # the shared resource: who is in now
        r.expire(name + ":inside", 60)
        most, over = max(most, inside), over + (inside > limit)
        fences.append(permit.fence)
        time.sleep(0.002)
        r.decr(name + ":inside")
print(json.dumps({"most": most, "over": over, "fences": fences}))
"""


def test_processes_never_exceed_the_limit(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    limit, procs = 3, 6
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(server.port), name, str(limit), "3"],
            stdout=subprocess.PIPE,
        )
        for _ in range(procs)
    ]
    results = [json.loads(w.communicate(timeout=120)[0]) for w in workers]
    assert all(w.returncode == 0 for w in workers)
    assert sum(res["over"] for res in results) == 0
    assert max(res["most"] for res in results) >= 2  # they did overlap: the test can fail
    fences = [f for res in results for f in res["fences"]]
    assert len(fences) == len(set(fences))  # every permit its own fence
    assert all(res["fences"] == sorted(res["fences"]) for res in results)


def test_a_waiter_is_not_dropped_from_its_place_while_its_hub_is_away(
    r: redis.Redis, name: str
) -> None:
    """A waiter at the head that tries again while its hub does not listen (reconnecting)
    gets the free permit: its own try must not ring it, fail, and drop it."""
    keys = keys_of(name)
    places: dict[str, str] = {}  # each token's place in the queue, as its replies give it

    def acquire(token: str, ttl: str, queue_ms: str, hub: str) -> list[int]:
        place = places.get(token, "")
        args = (token, ttl, "1", queue_ms, keys.bell_prefix, "1", hub, place, "9000", "1", "r")
        reply = r.eval(SHARED_ACQUIRE.source, 4, *keys.script_keys, *args)
        fence, pttl, server_us, places[token] = acquire_reply(reply, int(ttl))
        return [fence, pttl, server_us]

    assert acquire("h", "150", "0", "")[0] > 0  # holds the one permit for 150 ms
    assert acquire("a", "5000", "5000", "abcd")[0] == 0  # queued; its hub is not there
    assert acquire("b", "5000", "5000", "")[0] == 0  # queued behind it, on its bell
    time.sleep(0.3)  # h's permit runs out
    assert acquire("a", "5000", "0", "")[0] > 0  # a's try: first in line, so it is a's
    assert r.zrange(keys.lock, 0, -1) == [b"a"]


def test_a_permit_s_replies_take_the_lock_s_cheapest_shapes(r: redis.Redis, name: str) -> None:
    """As the lock's acquire (see test_scripts): a grant of one fence is the fence alone,
    a try that takes nothing one string."""
    keys = keys_of(name)
    args = ("a", "30000", "1", "30000", keys.bell_prefix, "1", "", "", "9000", "1", "r")
    granted = r.eval(SHARED_ACQUIRE.source, 4, *keys.script_keys, *args)
    assert isinstance(granted, int)
    assert granted == int(r.hget(keys.extra[0], "a") or 0)
    queued = r.eval(SHARED_ACQUIRE.source, 4, *keys.script_keys, "b", *args[1:])
    assert isinstance(queued, bytes)
    fence, pttl, _server_us, place = acquire_reply(queued, 30_000)
    assert fence == 0
    assert 25_000 < pttl <= 30_000
    assert r.lrange(keys.queue, 0, -1) == [place.encode()]
