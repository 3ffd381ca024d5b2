"""Batches (``batch=n``): a grant is lent to the lock object's callers up to n times
within ``batch_window`` without a round trip, each hold with a greater fence; then, or
when the window ends with the grant unused, it goes to the next waiter in line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
import redis

import families
import redlease
from redlease._batches import Lender
from redlease._flows import Grant, LockSpec
from redlease.tools import servers
from waiting_helpers import lock_key, queued, until_queued, wait_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Waiter(threading.Thread):
    """Acquires ``lock`` once in a thread; records when it got it, holds until told."""

    def __init__(self, lock: redlease.Lock) -> None:
        super().__init__(daemon=True)
        self.lock = lock
        self.lease: redlease.Lease | None = None
        self.got_at = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        self.lease = self.lock.acquire(timeout=30)
        self.got_at = time.monotonic()
        self.done.wait(30)
        self.lease.release()


def holder(r: redis.Redis, name: str) -> bytes | None:
    return r.get(lock_key(name))  # type: ignore[return-value]


def came_back(lock: redlease.Lock) -> redlease.Lock:
    """``lock`` after one hold released for real: taken again within its window, its next
    grant is a batch's (an object taken now and then never batches)."""
    lock.acquire().release()
    return lock


def test_a_lock_taken_now_and_then_never_batches(r: redis.Redis, name: str) -> None:
    clock = FakeClock()
    lock = redlease.Lock(r, name, ttl=30.0, batch=8, batch_window=1.0, clock=clock)
    first = lock.acquire()
    first.release()  # a real release: the first grant took one fence
    assert holder(r, name) is None
    clock.now += 1.5  # not back within the window
    later = lock.acquire()
    assert later.fence > first.fence
    # one fence: not a batch's grant (fences follow the server's clock, so the counter
    # tells how many a grant took: it stands at the grant's last)
    assert int(r.get(lock_key(name) + ":fence") or 0) == later.fence
    later.release()
    assert holder(r, name) is None
    again = lock.acquire()  # back at once: this grant is a batch's
    again.release()
    assert holder(r, name) == again.token.encode()  # parked for the next hold
    lent = lock.acquire()
    assert (lent.token, lent.fence) == (again.token, again.fence + 1)
    lent.release()
    after = redlease.Lock(r, name, ttl=30.0)  # (a fake clock never fires the timer)
    clock.now += 1.5
    assert lock.try_acquire() is not None  # the ended window's grant was given back first
    assert after.try_acquire() is None


def test_a_grant_is_lent_up_to_its_holds_then_handed_on(r: redis.Redis, name: str) -> None:
    owner = came_back(redlease.Lock(r, name, ttl=30.0, batch=3, batch_window=20.0))
    lease = owner.acquire()  # hold 1 of 3
    other = Waiter(redlease.Lock(r, name, ttl=30.0))
    other.start()
    wait_until(lambda: queued(r, name) == 1)
    held = [lease]
    lease.release()
    assert lease.released
    with pytest.raises(redlease.LockLost):
        lease.extend()  # a parked grant is not the released lease's to extend
    assert holder(r, name) == lease.token.encode()  # still held on the server
    assert redlease.Lock(r, name, ttl=30.0).try_acquire() is None  # not for a newcomer
    for _ in range(2):  # holds 2 and 3: lent again
        again = owner.try_acquire()
        assert again is not None
        held.append(again)
        again.release()
    wait_until(lambda: other.lease is not None)  # the third release handed it on
    assert owner.try_acquire() is None
    other.done.set()
    other.join(30)
    assert {h.token for h in held} == {lease.token}
    fences = [h.fence for h in held]
    assert fences == [lease.fence, lease.fence + 1, lease.fence + 2]
    assert other.lease is not None
    assert other.lease.fence > fences[-1]


def test_a_parked_grant_goes_to_the_next_in_line_when_the_window_ends(
    r: redis.Redis, name: str
) -> None:
    window = 0.3
    owner = came_back(redlease.Lock(r, name, ttl=30.0, batch=8, batch_window=window))
    lease = owner.acquire()
    other = Waiter(redlease.Lock(r, name, ttl=30.0))
    other.start()
    wait_until(lambda: queued(r, name) == 1)
    started = time.monotonic()
    lease.release()  # parked: the owner does not come back
    wait_until(lambda: other.lease is not None, timeout=20)
    # handed on when the window ended, not when the ttl (30 s) ran out
    assert other.got_at - started < window + 3.0
    assert other.lease is not None
    assert other.lease.fence >= lease.fence + 8  # after every fence the grant took
    other.done.set()
    other.join(30)


def test_a_batch_ends_with_its_window(r: redis.Redis, name: str) -> None:
    window = 0.2
    owner = redlease.Lock(r, name, ttl=30.0, batch=100, batch_window=window)
    lease = owner.acquire()
    other = Waiter(redlease.Lock(r, name, ttl=30.0))
    other.start()
    wait_until(lambda: queued(r, name) == 1)
    time.sleep(window + 0.1)
    lease.release()  # after the window: handed on, however many holds were left
    wait_until(lambda: other.lease is not None)
    assert owner.try_acquire() is None
    other.done.set()
    other.join(30)


def test_a_grant_whose_window_has_ended_is_given_back_before_a_new_one(
    r: redis.Redis, name: str
) -> None:
    clock = FakeClock()
    owner = came_back(redlease.Lock(r, name, ttl=30.0, batch=2, batch_window=5.0, clock=clock))
    lease = owner.acquire()
    lease.release()  # parked (its timer is 5 s away)
    clock.now += 6.0  # the window has ended, the timer has not fired yet
    again = owner.try_acquire()
    assert again is not None
    assert again.token != lease.token  # a new grant, after the old one was given back
    assert again.fence > lease.fence + 1  # past both of the old grant's fences
    assert holder(r, name) == again.token.encode()
    again.release()
    last = owner.try_acquire()  # hold 2 of 2: its release is a real one
    assert last is not None
    last.release()
    assert holder(r, name) is None


def test_batch_one_is_the_strict_hand_over(r: redis.Redis, name: str) -> None:
    owner = redlease.Lock(r, name, ttl=30.0, batch=1)
    lease = owner.acquire()
    other = Waiter(redlease.Lock(r, name, ttl=30.0))
    other.start()
    wait_until(lambda: queued(r, name) == 1)
    lease.release()
    wait_until(lambda: other.lease is not None)
    assert owner.try_acquire() is None
    other.done.set()
    other.join(30)
    assert other.lease is not None
    assert other.lease.fence > lease.fence


def test_threads_sharing_a_batched_lock_exclude_each_other(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=10.0, batch=4, batch_window=0.05)
    counter = "count:" + name
    fences: list[int] = []

    def work() -> None:
        for _ in range(50):
            with lock as lease:
                r.set(counter, int(r.get(counter) or 0) + 1)
                fences.append(lease.fence)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert int(r.get(counter) or 0) == 200
    assert len(set(fences)) == 200


@pytest.mark.parametrize("batch", [1, 8])
def test_64_threads_sharing_one_batched_lock_all_get_their_turns(
    r: redis.Redis, name: str, batch: int
) -> None:
    """64 threads share one lock object and come straight back, as a thread pool does: a
    batch lent among them must not leave any of them behind. Each acquire may wait 20 s;
    without batches none comes close, so neither may a batch (a lender that kept
    lending to the threads at hand while one stayed queued would starve it)."""
    lock = redlease.Lock(r, name, ttl=10.0, batch=batch)
    counter = "count:" + name
    timeouts: list[int] = []
    done: list[int] = []

    def work(i: int) -> None:
        for _ in range(10):
            try:
                with lock.acquire(timeout=20):
                    r.set(counter, int(r.get(counter) or 0) + 1)
            except redlease.AcquireTimeout:
                timeouts.append(i)
        done.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert timeouts == []
    assert sorted(done) == list(range(64))
    assert int(r.get(counter) or 0) == 640  # no lost update


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_is_not_lent_its_parents_grant(r: redis.Redis, name: str) -> None:
    owner = came_back(redlease.Lock(r, name, ttl=30.0, batch=2, batch_window=20.0))
    lease = owner.acquire()
    lease.release()  # parked in the parent
    pid = os.fork()
    if pid == 0:  # the child: the lock is busy (held by the parent's grant)
        os._exit(0 if owner.try_acquire() is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    again = owner.try_acquire()  # the parent still lends it (hold 2 of 2)
    assert again is not None
    assert again.token == lease.token
    again.release()
    assert holder(r, name) is None


def test_a_process_that_exits_gives_its_parked_grant_back(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    code = textwrap.dedent(f"""
        import redis, redlease
        r = redis.Redis.from_url({server.url!r})
        lock = redlease.Lock(r, {name!r}, ttl=30.0, batch=4, batch_window=20.0)
        lock.acquire().release()  # a real release; the object comes back at once, so
        lock.acquire().release()  # this grant is a batch's: parked for 20 s, yet we end now
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert holder(r, name) is None


async def test_asyncio_batches_behave_the_same(ar: Any, r: redis.Redis, name: str) -> None:
    owner = redlease.AsyncLock(ar, name, ttl=30.0, batch=2, batch_window=20.0)
    await (await owner.acquire()).release()  # it comes back: its next grant is a batch's
    newcomer = redlease.AsyncLock(ar, name, ttl=30.0)
    lease = await owner.acquire()  # hold 1 of 2
    waiting = asyncio.ensure_future(newcomer.acquire(timeout=30))
    await until_queued(lambda: queued(r, name))
    await lease.release()
    assert holder(r, name) == lease.token.encode()
    again = await owner.try_acquire()  # hold 2 of 2, lent again
    assert again is not None
    assert (again.token, again.fence) == (lease.token, lease.fence + 1)
    await again.release()  # the batch is spent: handed on
    other = await asyncio.wait_for(waiting, 10)
    assert other.fence > again.fence
    await other.release()


async def test_asyncio_parked_grant_goes_on_when_the_window_ends(
    ar: Any, r: redis.Redis, name: str
) -> None:
    owner = redlease.AsyncLock(ar, name, ttl=30.0, batch=4, batch_window=0.2)
    await (await owner.acquire()).release()
    lease = await owner.acquire()
    waiting = asyncio.ensure_future(redlease.AsyncLock(ar, name, ttl=30.0).acquire(timeout=30))
    await until_queued(lambda: queued(r, name))
    await lease.release()  # parked; the owner does not come back
    other = await asyncio.wait_for(waiting, 5)  # well before the ttl (30 s)
    assert other.fence > lease.fence
    await other.release()


def test_processes_in_batches_exclude_each_other(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    code = textwrap.dedent(f"""
        import json, redis, redlease
        r = redis.Redis.from_url({server.url!r})
        lock = redlease.Lock(r, {name!r}, ttl=10.0, batch=4, batch_window=0.05)
        fences = []
        for _ in range(60):
            with lock as lease:
                r.set("count:" + {name!r}, int(r.get("count:" + {name!r}) or 0) + 1)
                fences.append(lease.fence)
        print(json.dumps(fences))
    """)
    workers = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(4)
    ]
    fences: list[int] = []
    for worker in workers:
        out, _ = worker.communicate(timeout=120)
        assert worker.returncode == 0
        mine = json.loads(out)
        assert mine == sorted(set(mine))
        fences += mine
    assert int(r.get("count:" + name) or 0) == 240  # no lost update
    assert len(set(fences)) == 240  # no two holds shared a fence


def test_lender_rules_without_a_server() -> None:
    clock = FakeClock()
    spec = LockSpec.create("rules", 30.0, batch=3, batch_window=1.0, clock=clock)
    timers: list[tuple[float, Any]] = []
    released: list[str] = []
    lender = Lender(spec, lambda delay, callback: timers.append((delay, callback)), released.append)
    until = clock.now + 30.0
    lender.granted(Grant("a", 10, until), 3)
    assert lender.park("a", 10, until)
    assert [delay for delay, _ in timers] == [1.0]  # the window's end, armed once
    assert lender.park("a", 10, until) is False  # not the hold lent last
    lent, closed = lender.lend()
    assert closed is None
    assert lent == Grant("a", 11, until)
    timers[0][1]()  # a timer run while a hold is out gives nothing back
    assert released == []
    assert lender.park("a", 11, until)
    assert len(timers) == 2  # ... and is armed again by the next park
    lent, _ = lender.lend()
    assert lent is not None
    assert lent.fence == 12
    assert lender.park("a", 12, until) is False  # the last hold: a real release
    assert lender.lend() == (None, None)

    lender.granted(Grant("b", 13, until), 3)
    assert lender.park("b", 13, until)
    clock.now += 2.0
    timers[-1][1]()  # the window ended with the grant parked: given back
    assert released == ["b"]
    assert lender.lend() == (None, None)

    lender.granted(Grant("c", 16, until), 3)
    assert lender.park("c", 16, until)
    clock.now += 2.0  # the window ended before the timer ran: the next acquire gives it back
    assert lender.lend() == (None, "c")


def test_the_default_lock_batches_once_its_callers_come_straight_back(
    r: redis.Redis, name: str
) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, batch_window=20.0)  # batch=8 by default
    first = lock.acquire()
    first.release()  # a lock taken once: one fence, a real release
    assert holder(r, name) is None
    batched = lock.acquire()  # back at once: this grant takes the batch's 8 fences
    assert int(r.get(lock_key(name) + ":fence") or 0) == batched.fence + 7
    batched.release()
    assert holder(r, name) == batched.token.encode()  # parked for this object's next hold
    lent = lock.acquire()
    assert (lent.token, lent.fence) == (batched.token, batched.fence + 1)
    lent.release()
    unfair = redlease.Lock(r, name + ":u", ttl=30.0, fair=False)  # no batches unfair
    unfair.acquire().release()
    again = unfair.acquire()
    again.release()
    assert holder(r, name + ":u") is None


def test_a_release_does_not_park_while_this_object_has_a_caller_queued(
    r: redis.Redis, name: str
) -> None:
    window = 10.0
    lock = came_back(redlease.Lock(r, name, ttl=30.0, batch=8, batch_window=window))
    lease = lock.acquire()  # a batch's grant, lent to this thread
    other = Waiter(lock)  # the same object, in another thread: queued on the server
    other.start()
    wait_until(lambda: queued(r, name) == 1)
    started = time.monotonic()
    lease.release()  # a real release: the queued caller gets it now, not in 10 s
    wait_until(lambda: other.lease is not None, timeout=30)
    assert other.got_at - started < window / 2
    other.done.set()
    other.join(30)


def test_an_event_loop_that_stops_gives_its_parked_grant_back(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    async def main() -> str:
        client = families.aclient(port=server.port)
        lock = redlease.AsyncLock(client, name, ttl=30.0, batch=8, batch_window=20.0)
        async with lock:
            pass
        async with lock as lease:  # a batch's grant: parked when the block ends
            pass
        assert holder(r, name) == lease.token.encode()
        await client.aclose()
        return lease.token

    asyncio.run(main())  # the loop stops with the grant parked for 20 s more
    assert holder(r, name) is None
