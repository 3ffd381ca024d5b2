"""What a lock cycle costs the server, counted (``INFO commandstats``, commands run inside
scripts included): a handed-over section is the figure the contention benchmark reports
per critical section, and these counts pin it, so a script that grows shows up here, not
only in a benchmark run. The waiting keys keep one TTL that covers every live waiter."""

from __future__ import annotations

import redis

import redlease
from redlease._rules.keys import LockKeys
from redlease._rules.scripts import RELEASE
from waiting_helpers import in_thread, lock_key, queued, wait_until

# Not the lock's work: the test's own reads, and the hub's set-up.
_NOT_COUNTED = {"info", "llen", "subscribe", "ping", "config|get", "client|setinfo"}


def _calls(r: redis.Redis) -> dict[str, int]:
    stats = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def _spent(r: redis.Redis, before: dict[str, int]) -> int:
    after = _calls(r)
    return sum(n - before.get(k, 0) for k, n in after.items() if k not in _NOT_COUNTED)


def _handed_over(r: redis.Redis, lock: redlease.Lock, name: str) -> int:
    """Commands for: a waiter queues, the holder's release hands the lock to it, and the
    waiter releases it (nobody waiting then)."""
    holder = lock.acquire()
    before = _calls(r)
    waiter, got = in_thread(lambda: lock.acquire(timeout=30))
    wait_until(lambda: queued(r, name) == 1)
    holder.release()
    waiter.join(30)
    assert isinstance(got[0], redlease.Lease)
    got[0].release()
    return _spent(r, before)


def test_a_fair_hand_over_costs_at_most_its_budget(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    _handed_over(r, lock, name)  # scripts loaded, the hub subscribed
    # the waiter's tries 11 (a free-lock try first: the queue is empty; then queued, the
    # queue made afresh: its TTL set), the release that hands the lock over 9, the
    # waiter's release with nobody waiting 5 (34 before the scripts were trimmed, 29
    # before one SET took a fence, 27 before the queue carried the waiters' entries)
    assert _handed_over(r, lock, name) <= 23


def test_an_uncontended_cycle_costs_at_most_its_budget(r: redis.Redis, name: str) -> None:
    # acquire 5 (one EXISTS asks whether the attempt was given up and whether anyone
    # queued; one SET takes the fence), release 5; 11 and 12 before
    for fair, budget in ((True, 10), (False, 10)):
        lock = redlease.Lock(r, f"{name}:{fair}", ttl=30.0, fair=fair)
        lock.acquire().release()
        before = _calls(r)
        lock.acquire().release()
        assert _spent(r, before) <= budget, fair


def _unfair_release_counted(r: redis.Redis, keys: LockKeys, item: str) -> int:
    """Commands for an unfair release by "holder" of its lock, with ITEM in line."""
    r.set(keys.lock, "holder", px=30_000)
    r.rpush(keys.queue, item)
    r.pexpire(keys.queue, 30_000)
    before = _calls(r)
    args = (*keys.script_keys, "holder", "0", keys.bell_prefix, "5000")
    assert r.eval(RELEASE.source, 3, *args) == 1
    return _spent(r, before)


def test_an_unfair_release_past_a_woken_waiter_costs_at_most_its_budget(
    r: redis.Redis, name: str
) -> None:
    """The unfair lock's contended release: a waiter woken to compete is still first in
    line (the releasing caller took the lock again first), so the release only frees it."""
    keys = LockKeys.for_name(name)
    r.set(keys.lock + ":woken", "waiter", px=30_000)
    spent = _unfair_release_counted(r, keys, "waiter|99999999999999999:30000:0")
    # the script, and: the lock and the woken mark read in one MGET, the release mark
    # set, the head of the line (whether the woken waiter is still first), the lock
    # deleted (7 before: the queue's EXISTS and the woken mark's GET)
    assert spent <= 5
    assert not r.exists(keys.lock)
    assert r.get(keys.lock + ":woken") == b"waiter"
    assert r.lrange(keys.queue, 0, -1) == [b"waiter|99999999999999999:30000:0"]


def test_an_unfair_release_that_wakes_the_first_waiter_reads_the_line_once(
    r: redis.Redis, name: str
) -> None:
    """The unfair lock's contended release with nobody woken yet: it wakes the first in
    line (here one rung on its own bell, queued just now, so not starving), which stays
    first until it has had its turn."""
    keys = LockKeys.for_name(name)
    seconds, micros = r.time()
    since = seconds * 1_000_000 + micros
    spent = _unfair_release_counted(r, keys, f"waiter|{since + 60_000_000}:30000:{since}")
    # the script, and: the lock and the woken mark (MGET), the release mark, the head of
    # the line (read once, and handed on with the lock: 10 when it was read twice), the
    # clock, the woken mark set, the ring (pushed, its TTL), the lock deleted
    assert spent <= 9
    assert not r.exists(keys.lock)
    assert r.get(keys.lock + ":woken") == b"waiter"
    assert r.lpop(keys.bell("waiter")) is not None
    assert r.llen(keys.queue) == 1


def test_the_waiting_keys_keep_a_ttl_covering_the_longest_waiter(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    holder = lock.acquire()
    long_wait, long_got = in_thread(lambda: lock.acquire(timeout=25))
    wait_until(lambda: queued(r, name) == 1)
    short_wait, short_got = in_thread(lambda: lock.acquire(timeout=1))
    wait_until(lambda: queued(r, name) == 2)
    queue = lock_key(name) + ":line"
    assert r.pttl(queue) > 24_000  # the first waiter's 25 s, not the second's 1 s
    short_wait.join(30)
    assert isinstance(short_got[0], redlease.AcquireTimeout)
    assert r.pttl(queue) > 20_000
    holder.release()
    long_wait.join(30)
    assert isinstance(long_got[0], redlease.Lease)
    long_got[0].release()
    assert r.exists(queue) == 0


def test_a_shared_hold_cycle_costs_at_most_its_budget(r: redis.Redis, name: str) -> None:
    rw = redlease.ReadWriteLock(r, f"{name}:rw", ttl=30.0)
    for side, budget in (
        (redlease.Semaphore(r, f"{name}:sem", limit=4, ttl=30.0), 23),
        (rw.read, 23),
        (rw.write, 24),  # (and its writer mark, set and dropped)
    ):
        side.acquire().release()
        before = _calls(r)
        side.acquire().release()
        # acquire 13 (whether its attempt was given up among them), release 10 (32 before)
        assert _spent(r, before) <= budget
