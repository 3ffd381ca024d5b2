"""Fences across data loss, and keys that expire (issue 17, items 1 and 2), on real servers.

A fence counter starts at its server's clock in microseconds and then counts; it never runs
more than FENCE_LEAD_US ahead of that clock and it carries a TTL. So a counter lost with the
server's data (FLUSHALL, a restart without persistence) or expired starts again above every
fence handed out before, and nothing redlease writes stays on the server for good.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

import families
import redlease
from redlease._rules.keys import FENCE_LEAD_US, FENCE_LIMIT, LockKeys, forgotten_within
from redlease._rules.scripts import ACQUIRE
from redlease.tools import servers
from waiting_helpers import wait_until


@pytest.fixture
def own(binary: servers.ServerBinary) -> Iterator[servers.ServerProcess]:
    """A server of this test's own, without persistence: it may be flushed or restarted."""
    with servers.ServerProcess(binary) as proc:
        yield proc


@pytest.fixture
def admin(own: servers.ServerProcess) -> Iterator[Any]:
    with families.client(port=own.port) as client:
        yield client


def _server_us(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros)


def _keys_of(client: Any, name: str) -> list[bytes]:
    tag = LockKeys.for_name(name).lock
    return sorted(client.scan_iter(match=tag.replace("{", "\\{").replace("}", "\\}") + "*"))


def test_fences_keep_increasing_after_flushall(admin: Any, name: str) -> None:
    lock = redlease.Lock(admin, name, ttl=5.0)
    before = [lock.acquire(timeout=2.0) for _ in range(1)]
    before[0].release()
    with redlease.Lock(admin, name, ttl=5.0).acquire(timeout=2.0) as held:
        before.append(held)
    admin.flushall()
    assert admin.dbsize() == 0
    after = lock.acquire(timeout=2.0)
    after.release()
    assert after.fence > max(lease.fence for lease in before)


def test_fences_keep_increasing_after_a_restart_without_persistence(
    own: servers.ServerProcess, admin: Any, name: str
) -> None:
    lock = redlease.Lock(admin, name, ttl=5.0)
    fences = []
    for _ in range(3):
        with lock.acquire(timeout=2.0) as lease:
            fences.append(lease.fence)
    own.restart()
    assert admin.dbsize() == 0  # (the client reconnects) nothing was kept
    for _ in range(2):
        with lock.acquire(timeout=5.0) as lease:
            fences.append(lease.fence)
    assert fences == sorted(set(fences))


def test_redlock_fences_keep_increasing_when_every_node_lost_its_data(
    binary: servers.ServerBinary, name: str
) -> None:
    with ExitStack() as stack:
        nodes = [stack.enter_context(servers.ServerProcess(binary)) for _ in range(3)]
        clients = [stack.enter_context(families.client(port=n.port)) for n in nodes]
        first = redlease.Redlock(clients, name, ttl=5.0).acquire(timeout=2.0)
        first.release()
        for client in clients:
            client.flushall()
        # a new lock object: it does not remember the first one's fence
        again = redlease.Redlock(clients, name, ttl=5.0).acquire(timeout=2.0)
        again.release()
        assert again.fence > first.fence


def test_a_new_counter_starts_at_the_servers_clock(admin: Any, name: str) -> None:
    before = _server_us(admin)
    with redlease.Lock(admin, name, ttl=5.0).acquire(timeout=2.0) as lease:
        after = _server_us(admin)
        assert before < lease.fence <= after + 1


def test_every_key_has_a_ttl_and_all_are_gone_within_the_bound(admin: Any, name: str) -> None:
    ttl = 1.0
    lock = redlease.Lock(admin, name, ttl=ttl)
    holder = lock.acquire(timeout=2.0)
    got: list[redlease.Lease] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=5.0)))
    waiter.start()
    # a waiter that gives up leaves a queue behind it; one that is served, a bell
    with pytest.raises(redlease.AcquireTimeout):
        lock.acquire(timeout=0.05)
    wait_until(lambda: admin.llen(LockKeys.for_name(name).queue) >= 1)
    holder.release()
    waiter.join(timeout=5.0)
    assert len(got) == 1
    with got[0]:
        keys = _keys_of(admin, name)
        assert LockKeys.for_name(name).fence.encode() in keys
        assert {key: admin.pttl(key) > 0 for key in keys} == dict.fromkeys(keys, True)
    with redlease.Lock(admin, name, ttl=ttl).acquire(timeout=2.0):
        pass
    keys = sorted(set(keys) | set(_keys_of(admin, name)))
    bound_ms = forgotten_within(round(ttl * 1000))
    left = {key: admin.pttl(key) for key in keys}
    assert [key for key, ms in left.items() if ms == -1] == []  # (-2: gone already)
    # every key expires within the bound of the last release, by its own TTL ...
    assert [key for key, ms in left.items() if ms > bound_ms] == []
    # ... and is then gone (the server is read with a margin: a loaded machine is slow)
    wait_until(lambda: not any(admin.exists(key) for key in keys), timeout=bound_ms / 1000 + 5)


def test_a_counter_that_expired_starts_again_above_its_last_fence(admin: Any, name: str) -> None:
    lock = redlease.Lock(admin, name, ttl=0.1)
    with lock.acquire(timeout=2.0) as first:
        pass
    fence_key = LockKeys.for_name(name).fence
    wait_until(lambda: not admin.exists(fence_key), timeout=forgotten_within(100) / 1000 + 5)
    with lock.acquire(timeout=2.0) as again:
        assert again.fence > first.fence


def _acquire_script(client: Any, name: str, holds: int) -> list[int]:
    keys = LockKeys.for_name(name)
    token = f"t{time.monotonic_ns()}"
    reply = client.eval(
        ACQUIRE.source,
        3,
        *keys.script_keys,
        token,
        "5000",
        "1",
        "0",
        keys.bell_prefix,
        holds,
        "",
        "",
        "10000",
    )
    client.delete(keys.lock)
    if isinstance(reply, int):  # the fast path's reply for a grant of one fence
        return [reply, 5000, 0, 1]
    return [int(x) for x in reply[:4]]  # (its place in the queue: none)


def test_a_counter_never_runs_far_ahead_of_the_clock(admin: Any, name: str) -> None:
    fence_key = LockKeys.for_name(name).fence
    top, _pttl, _us, taken = _acquire_script(admin, name, 1000)
    assert taken == 1000  # a batch takes all it asks for while the counter is behind
    assert top - _server_us(admin) <= FENCE_LEAD_US
    ahead = _server_us(admin) + 100_000_000  # as if a faster clock had raised it 100 s ahead
    admin.set(fence_key, ahead, px=600_000)
    top, _pttl, _us, taken = _acquire_script(admin, name, 1000)
    assert (top, taken) == (ahead + 1, 1)  # one fence only, still above the last
    assert int(admin.get(fence_key)) == top
    # and the counter lives until the clock has passed it, whatever the ttl (5 s here)
    assert admin.pttl(fence_key) >= 99_000


def test_fences_stay_below_2_to_the_53(admin: Any, name: str) -> None:
    admin.set(LockKeys.for_name(name).fence, FENCE_LIMIT - 1, px=60_000)
    lock = redlease.Lock(admin, name, ttl=5.0)
    with pytest.raises(redlease.LockError, match="2\\^53"):
        lock.acquire(timeout=1.0)
    assert not admin.exists(LockKeys.for_name(name).lock)  # nothing held, nothing left
    fence = LockKeys.for_name(name).fence
    assert int(admin.get(fence)) == FENCE_LIMIT - 1  # the counter's value back
    # for an ordinary grant's keep (twice the ttl and a margin), not until the clock
    # reaches it: once a wrong clock is put right, the name works again
    assert 0 < admin.pttl(fence) <= 60_000
