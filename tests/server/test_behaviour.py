"""One behaviour suite, run against both Lock and AsyncLock (see twins.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

import families
import redlease
from waiting_helpers import lock_key


def test_with_block_yields_a_held_lease(twin: Any, r: redis.Redis, name: str) -> None:
    with twin.lock(name, ttl=5.0) as lease:
        assert lease.name == name
        assert isinstance(lease.fence, int)
        assert lease.fence > 0
        assert len(lease.token) >= 32
        assert 4.0 < lease.remaining() <= 5.0
        assert r.get(lock_key(name)) == lease.token.encode()
        assert 0 < r.pttl(lock_key(name)) <= 5000
        assert not lease.lost
        lease.check()
    assert r.exists(lock_key(name)) == 0


def test_fences_strictly_increase_across_holders(twin: Any, name: str) -> None:
    lock = twin.lock(name, ttl=5.0)
    fences = []
    for _ in range(5):
        lease = lock.acquire(timeout=1.0)
        fences.append(lease.fence)
        lease.release()
    assert fences == sorted(fences)
    assert len(set(fences)) == 5


def test_try_acquire_returns_none_when_busy(twin: Any, name: str) -> None:
    lock = twin.lock(name)
    held = lock.try_acquire()
    assert held is not None
    assert lock.try_acquire() is None
    assert twin.lock(name).try_acquire() is None
    held.release()
    again = lock.try_acquire()
    assert again is not None
    again.release()


def test_acquire_times_out_with_acquire_timeout(twin: Any, name: str) -> None:
    lock = twin.lock(name)
    held = lock.acquire()
    started = time.monotonic()
    with pytest.raises(redlease.AcquireTimeout) as caught:
        lock.acquire(timeout=0.2)
    assert isinstance(caught.value, TimeoutError)
    assert 0.15 <= time.monotonic() - started < 5.0
    with pytest.raises(redlease.AcquireTimeout):
        lock.acquire(timeout=0)
    held.release()


def test_release_after_expiry_raises_lock_lost(twin: Any, r: redis.Redis, name: str) -> None:
    lease = twin.lock(name, ttl=0.05).acquire()
    deadline = time.monotonic() + 5
    while r.exists(lock_key(name)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lease.lost
    with pytest.raises(redlease.LockLost):
        lease.check()
    with pytest.raises(redlease.LockLost):
        lease.release()


def test_release_never_frees_another_holders_lock(twin: Any, r: redis.Redis, name: str) -> None:
    lock = twin.lock(name, ttl=0.05)
    first = lock.acquire()
    time.sleep(0.1)  # first's lease runs out...
    second = lock.acquire(timeout=2.0)  # ...and someone else takes the lock
    with pytest.raises(redlease.LockLost):
        first.release()  # the old holder's late release
    assert r.get(lock_key(name)) == second.token.encode()
    assert second.fence > first.fence
    second.release()


def test_extend_resets_validity_and_fails_when_not_ours(
    twin: Any, r: redis.Redis, name: str
) -> None:
    lease = twin.lock(name, ttl=1.0).acquire()
    lease.extend(30.0)
    assert lease.remaining() > 25.0
    assert r.pttl(lock_key(name)) > 25_000
    lease.extend()  # back to the lock's own ttl
    assert lease.remaining() <= 1.0
    r.set(lock_key(name), "someone-else", px=10_000)  # taken over
    with pytest.raises(redlease.LockLost):
        lease.extend()
    assert lease.lost
    with pytest.raises(redlease.LockLost):
        lease.check()


def test_release_twice_is_harmless(twin: Any, name: str) -> None:
    lease = twin.lock(name).acquire()
    lease.release()
    lease.release()
    with pytest.raises(redlease.LockLost):
        lease.extend()


def test_on_lost_runs_once_when_loss_is_found(twin: Any, r: redis.Redis, name: str) -> None:
    seen: list[Any] = []
    lease = twin.lock(name, ttl=5.0, on_lost=seen.append).acquire()
    r.delete(lock_key(name))
    with pytest.raises(redlease.LockLost):
        lease.extend()
    with pytest.raises(redlease.LockLost):
        lease.release()
    assert len(seen) == 1


def test_one_lock_object_shared_by_threads(twin: Any, r: redis.Redis, name: str) -> None:
    lock = twin.lock(name, ttl=10.0)
    r.set("counter", 0)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                with lock:
                    value = int(r.get("counter") or 0)
                    time.sleep(0.0005)
                    r.set("counter", value + 1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert int(r.get("counter") or 0) == 80


def test_nested_with_blocks_on_different_locks(twin: Any, r: redis.Redis, name: str) -> None:
    a, b = twin.lock(name + ":a"), twin.lock(name + ":b")
    with a as outer, b as inner:
        assert outer.fence > 0
        assert inner.fence > 0
    assert r.exists(lock_key(name + ":a"), lock_key(name + ":b")) == 0


def test_lease_can_be_released_from_another_thread(twin: Any, r: redis.Redis, name: str) -> None:
    lease = twin.lock(name).acquire()
    t = threading.Thread(target=lease.release)
    t.start()
    t.join(timeout=10)
    assert r.exists(lock_key(name)) == 0


def test_every_lock_key_has_a_ttl(twin: Any, r: redis.Redis, name: str) -> None:
    lock = twin.lock(name, ttl=5.0)
    held = lock.acquire()
    waiter_done = threading.Event()

    def wait() -> None:
        lease = lock.acquire(timeout=10)
        lease.release()
        waiter_done.set()

    t = threading.Thread(target=wait)
    t.start()
    deadline = time.monotonic() + 5
    while not r.exists(lock_key(name) + ":line") and time.monotonic() < deadline:
        time.sleep(0.005)
    for key in r.scan_iter("*"):
        if not key.endswith(b":fence"):
            assert r.pttl(key) != -1, key
    held.release()
    t.join(timeout=10)
    assert waiter_done.is_set()
    for key in r.scan_iter("*"):
        if not key.endswith(b":fence"):
            assert r.pttl(key) != -1, key


def test_ttl_as_timedelta(twin: Any, name: str) -> None:
    from datetime import timedelta

    lease = twin.lock(name, ttl=timedelta(seconds=3)).acquire(timeout=timedelta(seconds=1))
    assert 2.0 < lease.remaining() <= 3.0
    lease.release()


def test_with_block_reports_a_lost_lease_unless_the_block_failed(
    twin: Any, r: redis.Redis, name: str
) -> None:
    lock = twin.lock(name, ttl=5.0)
    with pytest.raises(redlease.LockLost), lock:
        r.delete(lock_key(name))  # the lease is gone before the block ends

    def fail_after_losing_it() -> None:
        with lock:
            r.delete(lock_key(name))
            raise KeyError("the block's own failure is the one reported")

    with pytest.raises(KeyError):
        fail_after_losing_it()


@pytest.mark.parametrize("parser", ["hiredis", "python"])
def test_either_reply_parser_and_a_server_timeout(server: Any, name: str, parser: str) -> None:
    """hiredis is optional: the pure-Python parser works too (and a paused server is a
    timeout, not a hang, on both the lean path and redis-py's own)."""
    from redis._parsers import _RESP2Parser

    options: dict[str, Any] = {"parser_class": _RESP2Parser} if parser == "python" else {}
    pool = families.pool(port=server.port, **options)
    client = families.client(connection_pool=pool)
    try:
        _times_out_while_paused(redlease.Lock(client, name, ttl=1.0), server)
    finally:
        client.close()
        pool.disconnect()  # a pool passed in is not closed by the client


def test_a_server_that_stops_answering_times_out_and_leaves_no_stray_reply(
    twin: Any, server: Any, name: str
) -> None:
    """A reply that comes too late must never be read as a later command's: the
    connection it was due on is dropped (redis-py's asyncio read with a timeout would
    return None and keep it)."""
    _times_out_while_paused(twin.lock(name, ttl=1.0), server)


def _times_out_while_paused(lock: Any, server: Any) -> None:
    """A paused server is a BackendError, not a hang; once it answers again (the
    stalled commands too), each lease gets its own replies."""
    with lock as lease:  # a connection is open and idle
        assert lease.fence > 0
    server.pause()
    try:
        with pytest.raises(redlease.BackendError, match="did not answer in time"):
            lock.acquire(timeout=0)
    finally:
        server.resume()
    for _ in range(3):
        lease = lock.acquire(timeout=5)
        assert lease.fence > 0
        lease.release()
        assert lease.released
