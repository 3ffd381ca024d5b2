"""Waiting without polling: doorbells rung by the release script, FIFO hand-over,
no lost wake-ups, and waiters that die, time out or leave never block the queue."""

from __future__ import annotations

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
from redlease._rules import flows as _flows
from redlease._rules import ops as _ops
from redlease._sync.io import IO
from redlease.tools import servers
from waiting_helpers import lock_key, queued, wait_until


def drive(flow: Any, reply: Any, io: IO) -> Any:
    """Run a flow to its end from a given reply on."""
    try:
        op = flow.send(reply)
        while True:
            op = flow.send(io.execute(op))
    except StopIteration as stop:
        return stop.value


@pytest.mark.parametrize("fair", [True, False])
def test_no_lost_wake_up_when_release_lands_before_the_wait(
    r: redis.Redis, name: str, fair: bool
) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, fair=fair)
    holder = lock.acquire()
    attempt = _flows.Acquisition(lock._core.spec, 20.0, wait=True)
    io = IO(r)
    flow = attempt.run()
    wait_op = next(flow)
    while not isinstance(wait_op, _ops.Wait):  # the failed try: queued, ~30 s left
        wait_op = flow.send(io.execute(wait_op))
    holder.release()  # the release lands in the gap before we block
    started = time.monotonic()
    rung = io.execute(wait_op)  # must return at once, not after the holder's 30 s
    assert time.monotonic() - started < 5.0
    assert rung is not None
    grant = drive(flow, rung, io)  # fair: granted; not fair: woken, tries, wins
    assert isinstance(grant, _flows.Grant)
    assert r.get(lock_key(name)) == attempt.token.encode()


def test_fifo_order_and_no_barging(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    holder = lock.acquire()
    order: list[int] = []

    def waiter(i: int) -> None:
        lease = lock.acquire(timeout=30)
        order.append(i)
        time.sleep(0.01)
        lease.release()

    threads = []
    for i in range(5):
        t = threading.Thread(target=waiter, args=(i,))
        t.start()
        threads.append(t)
        wait_until(lambda i=i: queued(r, name) == i + 1)
    holder.release()
    # the lock now passes from waiter to waiter; a newcomer never gets in between
    wait_until(lambda: r.exists(lock_key(name)) == 1)
    assert lock.try_acquire() is None
    for t in threads:
        t.join(timeout=30)
    assert order == [0, 1, 2, 3, 4]


def test_unfair_mode_still_serves_every_waiter(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0, fair=False)
    holder = lock.acquire()
    done: list[int] = []

    def waiter(i: int) -> None:
        with lock:
            done.append(i)

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: queued(r, name) == 4)
    holder.release()
    for t in threads:
        t.join(timeout=30)
    assert sorted(done) == [0, 1, 2, 3]


def test_waiter_wakes_when_a_crashed_holders_lease_expires(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    code = textwrap.dedent(f"""
        import os, signal, redis, redlease
        redlease.Lock(redis.Redis.from_url({server.url!r}), {name!r}, ttl=1.0).acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert subprocess.run([sys.executable, "-c", code], timeout=60, check=False).returncode == -9
    left = r.pttl(lock_key(name)) / 1000
    assert left > 0
    started = time.monotonic()
    lease = redlease.Lock(r, name, ttl=5.0).acquire(timeout=30)
    waited = time.monotonic() - started
    assert waited < left + 1.5  # woken by the expiry itself, not a polling schedule
    lease.release()


def test_a_short_wait_ends_on_time_on_an_idle_server(r: redis.Redis, name: str) -> None:
    """An idle server notices a BLPOP's timeout only at its next tick, up to 100 ms late;
    the driver stops waiting for it soon after the timeout and tries again."""
    took = []
    for _ in range(5):
        redlease.Lock(r, name, ttl=0.05).acquire()  # never released: it expires
        started = time.monotonic()
        lease = redlease.Lock(r, name, ttl=5.0).acquire(timeout=10)
        took.append(time.monotonic() - started)
        lease.release()
    assert sorted(took)[2] < 0.05 + 0.04


def test_timeout_leaves_the_queue_clean(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    holder = lock.acquire()
    with pytest.raises(redlease.AcquireTimeout):
        lock.acquire(timeout=0.2)
    assert queued(r, name) == 0
    holder.release()
    assert r.exists(lock_key(name)) == 0  # nobody was granted it after leaving


def test_a_waiter_that_died_does_not_block_the_queue(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    # The holder's lease outlasts the waiter's start (over a second on a loaded machine:
    # a lease of 1 s ran out first, and the waiter took the lock instead of queueing).
    holder = redlease.Lock(r, name, ttl=60.0).acquire()
    lock = redlease.Lock(r, name, ttl=1.0)
    code = textwrap.dedent(f"""
        import redis, redlease
        redlease.Lock(redis.Redis.from_url({server.url!r}), {name!r}, ttl=1.0).acquire()
    """)
    dead = subprocess.Popen([sys.executable, "-c", code])
    wait_until(lambda: queued(r, name) == 1, timeout=30)
    dead.kill()
    dead.wait(timeout=10)
    started = time.monotonic()
    holder.release()  # handed to the dead waiter, whose lease then runs out
    lease = lock.acquire(timeout=30)
    assert time.monotonic() - started < 1.0 + 2.5
    lease.release()


def test_idle_waiters_send_no_commands(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    holder = lock.acquire()
    threads = [
        threading.Thread(target=lambda: lock.acquire(timeout=30).release()) for _ in range(3)
    ]
    for t in threads:
        t.start()
    try:
        # Queued (the queueing script is a waiter's last command), and listening: the
        # process's hub subscribed to the lock's channel.
        wait_until(lambda: queued(r, name) == 3)
        assert len(r.pubsub_channels(lock_key(name) + ":bell:@*")) == 1
        time.sleep(0.2)
        before = r.info("commandstats")
        time.sleep(1.0)
        after = r.info("commandstats")
        # only our own INFO calls happened while the waiters were idle, and perhaps the
        # hub's housekeeping: it drops the channels of earlier tests' locks once unused
        # for LINGER seconds (once per channel, not a poll), never one a waiter listens on
        changed = {k for k in after if after[k]["calls"] != before.get(k, {}).get("calls")}
        assert changed <= {"cmdstat_info", "cmdstat_unsubscribe"}
        assert len(r.pubsub_channels(lock_key(name) + ":bell:@*")) == 1
    finally:
        holder.release()
        for t in threads:
            t.join(timeout=30)


def test_waiters_leave_room_in_a_bounded_pool(r: redis.Redis, name: str) -> None:
    client = families.client(
        connection_pool=families.blocking_pool(
            port=r.connection_pool.connection_kwargs["port"], max_connections=20, timeout=1
        )
    )
    lock = redlease.Lock(client, name, ttl=30.0)
    holder = lock.acquire()
    threads = [
        threading.Thread(target=lambda: lock.acquire(timeout=30).release()) for _ in range(4)
    ]
    for t in threads:
        t.start()
    wait_until(lambda: queued(r, name) == 4)
    assert client.ping()  # the application still gets a connection
    holder.release()
    for t in threads:
        t.join(timeout=30)
    client.connection_pool.disconnect()  # a pool passed in is not closed by the client
