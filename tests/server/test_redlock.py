"""Redlock over real, independent server processes: quorum, pauses, lost replies, a node
restarted empty, mutual exclusion across processes, validation; sync and asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import redis

import families
import redlease
from redlease._async.io import AsyncIO
from redlease._rules.flows import LockSpec
from redlease._rules.keys import LockKeys
from redlease._rules.ops import Sleep
from redlease._rules.quorum import SAFE, UNREAD, Fanout, QuorumAcquisition, QuorumSpec
from redlease._rules.quorum import extend as quorum_extend
from redlease._rules.quorum import release as quorum_release
from redlease._sync.io import IO
from redlease._wire import stale as _stale
from redlease.testing import FakeClock
from redlease.tools import servers
from redlease.tools.chaos.proxy import FaultProxy
from redlease.tools.chaos.unsafe import Unsafe, unsafe_redlock
from waiting_helpers import lock_key

NODES = 5


@pytest.fixture(scope="module")
def procs(server_kind: str) -> Iterator[list[servers.ServerProcess]]:
    """Five lock nodes and, last, a separate server for the workload's counter (of each
    server kind, reached through its family's clients)."""
    with servers.running(NODES + 1, server_kind) as started:
        yield started


@pytest.fixture
def nodes(procs: list[servers.ServerProcess]) -> Iterator[list[servers.ServerProcess]]:
    for proc in procs:
        proc.resume()
        families.client(port=proc.port).flushall()
    yield procs[:NODES]
    for proc in procs:
        proc.resume()  # a failed test must not leave a server stopped


@pytest.fixture
def clients(nodes: list[servers.ServerProcess]) -> Iterator[list[redis.Redis]]:
    made = [families.client(port=p.port) for p in nodes]
    yield made
    for client in made:
        client.close()


def _lock_keys(clients: list[redis.Redis], name: str) -> list[int]:
    """How many nodes still have the lock key."""
    return [int(c.exists(LockKeys.for_name(name).lock)) for c in clients]


def _released_everywhere(clients: list[redis.Redis], name: str) -> list[int]:
    """``_lock_keys`` once no node has the key, or after 5 s: a release returns once a
    majority confirmed it, and the other nodes apply it as their turn comes."""
    deadline = time.monotonic() + 5.0
    while any(_lock_keys(clients, name)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return _lock_keys(clients, name)


def _fence_key(name: str) -> str:
    return LockKeys.for_name(name).fence


def _counter(client: redis.Redis, name: str) -> int:
    return int(client.get(_fence_key(name)) or 0)


# -- the basics -----------------------------------------------------------------------------


@pytest.mark.parametrize("count", [3, 5])
def test_acquire_extend_release(clients: list[redis.Redis], name: str, count: int) -> None:
    lock = redlease.Redlock(clients[:count], name, ttl=5.0)
    assert lock.quorum == count // 2 + 1
    with lock as lease:
        assert lease.name == name
        assert lease.fence >= 1
        assert 4.8 < lease.remaining() <= 5.0
        assert lock.try_acquire() is None  # contention is not an error
        lease.extend(8.0)
        assert 7.8 < lease.remaining() <= 8.0
        assert all(7000 < c.pttl(lock_key(name)) <= 8000 for c in clients[:count])
        lease.check()
    assert lease.released
    assert _released_everywhere(clients[:count], name) == [0] * count


def test_fences_strictly_increase(clients: list[redis.Redis], name: str) -> None:
    lock = redlease.Redlock(clients, name, ttl=5.0)
    fences = []
    for _ in range(5):
        lease = lock.acquire(timeout=1.0)
        fences.append(lease.fence)
        lease.release()
    assert fences == sorted(set(fences))


def test_waiter_gets_the_lock_when_released(clients: list[redis.Redis], name: str) -> None:
    lock = redlease.Redlock(clients, name, ttl=5.0)
    lease = lock.acquire()
    with pytest.raises(redlease.AcquireTimeout):
        lock.acquire(timeout=0.05)
    lease.release()
    assert lock.acquire(timeout=0.5).fence > lease.fence


def test_expired_holder_is_told(clients: list[redis.Redis], name: str) -> None:
    lock = redlease.Redlock(clients[:3], name, ttl=0.1)
    lease = lock.acquire()
    time.sleep(0.15)
    assert lease.lost
    with pytest.raises(redlease.LockLost):
        lease.check()
    other = lock.acquire(timeout=0.5)
    assert other.fence > lease.fence
    with pytest.raises(redlease.LockLost):
        lease.release()
    other.release()


# -- the sans-IO core, with a fake clock and scripted replies ---------------------------------


def _spec(count: int, ttl: float = 10.0, clock: FakeClock | None = None) -> QuorumSpec:
    lock = LockSpec.create("core", ttl, clock=clock or FakeClock())
    return QuorumSpec.create(lock, [f"n{i}" for i in range(count)], None, SAFE)


def _yes(counter: int) -> int:
    return counter  # (the acquire script's grant: the node's fence counter alone)


def _held(pttl: int) -> list[int]:
    return [0, 0, pttl]


NO_REPLY = redlease.BackendError("the server did not answer in time")


def test_core_grants_on_a_majority_counting_elapsed_time() -> None:
    clock = FakeClock()
    spec = _spec(5, clock=clock)
    flow = QuorumAcquisition(spec, 0.0, wait=False).run()
    fan = next(flow)
    assert isinstance(fan, Fanout)
    assert fan.nodes == (0, 1, 2, 3, 4)
    assert fan.timeout == pytest.approx(0.1)  # min(ttl * 5%, 100 ms)
    clock.advance(0.5)  # the round took half a second
    with pytest.raises(StopIteration) as done:
        flow.send([_yes(7), _yes(7), _yes(7), NO_REPLY, _held(900)])
    grant = done.value.value
    assert grant.fence == 7  # all yes-nodes agree: no second round
    # validity = ttl - elapsed - (ttl * 1% + 2 ms), from before the first send
    assert grant.valid_until - clock() == pytest.approx(10.0 - 0.5 - 0.102)


def test_core_too_slow_is_not_a_grant_and_releases_everywhere_it_may_hold() -> None:
    clock = FakeClock()
    flow = QuorumAcquisition(_spec(3, ttl=1.0, clock=clock), 0.0, wait=False).run()
    next(flow)
    clock.advance(0.99)  # 1 s - 0.99 s - 12 ms < 0
    release = flow.send([_yes(1), _yes(1), NO_REPLY])
    assert isinstance(release, Fanout)
    assert release.call.script.name == "redlock_release"
    assert release.nodes == (0, 1, 2)  # the unanswered node may hold it too
    with pytest.raises(StopIteration) as done:
        flow.send([1, 1, NO_REPLY])
    assert done.value.value is None


def test_core_fence_is_the_majority_max_raised_on_lagging_nodes() -> None:
    flow = QuorumAcquisition(_spec(5), 0.0, wait=False).run()
    next(flow)
    # node 0 restarted empty, node 2 missed some grants; nodes 3-4 are held elsewhere
    raise_round = flow.send([_yes(1), _yes(9), _yes(5), NO_REPLY, _held(100)])
    assert isinstance(raise_round, Fanout)
    assert raise_round.call.script.name == "redlock_fence"
    assert raise_round.nodes == (0, 2)
    assert raise_round.call.args[1] == "9"
    with pytest.raises(StopIteration) as done:
        flow.send([1, 1])
    assert done.value.value.fence == 9


def test_core_fence_needs_a_majority_at_the_token() -> None:
    flow = QuorumAcquisition(_spec(3), 0.0, wait=False).run()
    next(flow)
    flow.send([_yes(1), _yes(9), NO_REPLY])
    release = flow.send([0])  # node 0 lost our key before it could be raised
    assert isinstance(release, Fanout)
    assert release.call.script.name == "redlock_release"
    with pytest.raises(StopIteration) as done:
        flow.send([1, 1, NO_REPLY])
    assert done.value.value is None


def test_core_quorum_error_names_nodes_after_releasing() -> None:
    flow = QuorumAcquisition(_spec(5), 0.0, wait=False).run()  # try_acquire: one round
    next(flow)
    release = flow.send([_yes(3), _held(100), NO_REPLY, NO_REPLY, NO_REPLY])
    assert isinstance(release, Fanout)
    assert release.nodes == (0, 2, 3, 4)
    with pytest.raises(redlease.QuorumError) as raised:
        flow.send([1, NO_REPLY, NO_REPLY, NO_REPLY])
    assert sorted(raised.value.failures) == ["n2", "n3", "n4"]
    assert "2 of 5 nodes answered, 3 needed" in str(raised.value)


def test_core_each_round_has_a_token_of_its_own() -> None:
    """A failed round's release may be held up on a stopped node and run there after a
    later round's SET: it must not be able to delete what the later round holds."""
    clock = FakeClock()
    flow = QuorumAcquisition(_spec(3, clock=clock), 1.0, wait=True).run()
    first = next(flow)
    assert isinstance(first, Fanout)
    release = flow.send([_yes(1), NO_REPLY, NO_REPLY])
    assert isinstance(release, Fanout)
    assert release.call.args[0] == first.call.args[0]  # the failed round's own key
    sleep = flow.send([1, NO_REPLY, NO_REPLY])
    assert isinstance(sleep, Sleep)
    clock.advance(sleep.seconds)
    second = flow.send(None)
    assert isinstance(second, Fanout)
    assert second.call.args[0] != first.call.args[0]


def test_core_unreachable_nodes_are_retried_until_the_deadline() -> None:
    """A round without a quorum because nodes did not answer is retried after a random
    delay, like one lost to contention; at the deadline the last round says which it
    was: QuorumError naming the nodes (an outage), or None (contention)."""
    clock = FakeClock()
    flow = QuorumAcquisition(_spec(3, clock=clock), 1.0, wait=True).run()
    next(flow)
    rounds = 0
    with pytest.raises(redlease.QuorumError) as raised:  # noqa: PT012 (a loop of rounds)
        while True:
            rounds += 1
            release = flow.send([_yes(1), NO_REPLY, NO_REPLY])
            assert isinstance(release, Fanout)  # wherever the SET may have landed
            sleep = flow.send([1, NO_REPLY, NO_REPLY])
            assert isinstance(sleep, Sleep)
            assert 0 < sleep.seconds <= 0.05
            clock.advance(sleep.seconds)
            assert isinstance(flow.send(None), Fanout)
    assert sorted(raised.value.failures) == ["n1", "n2"]
    assert rounds > 10
    assert clock() == pytest.approx(1001.0)  # not before the deadline
    # nodes back in time: the next round takes the lock
    flow = QuorumAcquisition(_spec(3, clock=clock), 1.0, wait=True).run()
    next(flow)
    flow.send([NO_REPLY, NO_REPLY, _held(100)])
    assert isinstance(flow.send([1, 1]), Sleep)
    assert isinstance(flow.send(None), Fanout)
    with pytest.raises(StopIteration) as done:
        flow.send([_yes(4), _yes(4), _held(100)])
    assert done.value.value.fence == 4
    # contention in the last round: None (the caller's AcquireTimeout)
    flow = QuorumAcquisition(_spec(3, clock=clock), 0.01, wait=True).run()
    next(flow)
    flow.send([NO_REPLY, NO_REPLY, _held(100)])
    step = flow.send([1, 1])
    while isinstance(step, Sleep):
        clock.advance(step.seconds)
        flow.send(None)
        step = _step(flow, [_held(100), _held(100), _held(100)])
    assert isinstance(step, StopIteration)
    assert step.value is None


def _step(flow: Any, reply: Any) -> Any:
    """The flow's next step, or the StopIteration that carries its result."""
    try:
        return flow.send(reply)
    except StopIteration as end:
        return end


def test_core_waits_at_most_until_the_holders_expire_and_the_deadline() -> None:
    clock = FakeClock()
    flow = QuorumAcquisition(_spec(3, clock=clock), 0.3, wait=True).run()
    next(flow)
    delays = []
    for _ in range(1000):
        step = _step(flow, [_held(400), _held(400), _held(20_000)])
        if isinstance(step, StopIteration):
            assert step.value is None  # the deadline passed: not acquired
            break
        assert isinstance(step, Sleep)  # nothing to release: every node said "held"
        delays.append(step.seconds)
        clock.advance(step.seconds)
        assert isinstance(flow.send(None), Fanout)
    else:
        pytest.fail("the acquisition never gave up")
    # randomized, growing, capped; the last one is cut short by the deadline
    assert all(0.001 <= d <= 0.05 for d in delays[:-1])
    assert 0 < delays[-1] <= 0.05
    assert sum(delays) == pytest.approx(0.3)  # slept until the deadline, never past it
    flow = QuorumAcquisition(_spec(3, clock=clock), 5.0, wait=True).run()
    next(flow)
    for _ in range(8):  # the backoff would grow to 50 ms; the holders end in 3 ms
        step = flow.send([_held(3), _held(3), _held(20_000)])
        assert isinstance(step, Sleep)
        assert step.seconds <= 0.003 + 0.002
        flow.send(None)


def test_core_extend_and_release_count_a_majority() -> None:
    clock = FakeClock()
    spec = _spec(5, clock=clock)
    flow = quorum_extend(spec, "t", 4000)
    next(flow)
    with pytest.raises(StopIteration) as done:
        flow.send([1, 1, 1, 0, NO_REPLY])
    assert done.value.value - clock() == pytest.approx(4.0 - 0.042)
    flow = quorum_extend(spec, "t", 4000)
    next(flow)
    with pytest.raises(redlease.LockLost):
        flow.send([1, 1, 0, 0, 0])
    flow = quorum_extend(spec, "t", 4000)
    next(flow)
    with pytest.raises(redlease.QuorumError):
        flow.send([1, 1, 0, NO_REPLY, NO_REPLY])  # the silent ones may still be ours
    released = quorum_release(spec, "t", frozenset(range(5)))
    next(released)
    with pytest.raises(redlease.LockLost):
        released.send([1, 0, 0, 0, NO_REPLY])


def test_core_a_majority_of_yes_is_enough_and_unread_replies_count_as_neither() -> None:
    spec = _spec(5)
    flow = QuorumAcquisition(spec, 0.0, wait=False).run()
    fan = next(flow)
    assert isinstance(fan, Fanout)
    assert fan.enough == 3  # the driver may stop reading at the third yes
    assert fan.yes(_yes(4))
    assert not fan.yes([0, 0, 50])
    assert fan.call.args[2] == "0"  # no token handed out yet: nothing to raise nodes past
    # nodes 3 and 4 were not read: no second round, and the lease is granted
    with pytest.raises(StopIteration) as done:
        flow.send([_yes(7), _yes(7), _yes(7), UNREAD, UNREAD])
    grant = done.value.value
    assert grant.fence == 7
    released = quorum_release(spec, grant.token, grant.nodes)
    fan = next(released)
    assert isinstance(fan, Fanout)
    assert fan.enough == 3
    assert fan.nodes == (0, 1, 2, 3, 4)
    with pytest.raises(StopIteration):
        released.send([1, 1, 1, UNREAD, UNREAD])
    # the next acquisition passes the highest token handed out, to raise lagging nodes
    flow = QuorumAcquisition(spec, 0.0, wait=False).run()
    fan = next(flow)
    assert isinstance(fan, Fanout)
    assert fan.call.args[2] == "7"
    # a round that fails releases every node that may hold it, unread ones included
    flow = QuorumAcquisition(_spec(3, ttl=1.0), 0.0, wait=False).run()
    next(flow)
    raise_round = flow.send([_yes(3), _yes(5), UNREAD])
    assert isinstance(raise_round, Fanout)
    assert raise_round.nodes == (0,)
    release = flow.send([0])  # node 0 lost our key: 1 of 2 needed at the token
    assert isinstance(release, Fanout)
    assert release.nodes == (0, 1, 2)
    assert release.enough == 0


# -- faults -----------------------------------------------------------------------------------


def test_two_of_five_paused_still_acquires_promptly(
    nodes: list[servers.ServerProcess], clients: list[redis.Redis], name: str
) -> None:
    lock = redlease.Redlock(clients, name, ttl=10.0)
    try:
        nodes[1].pause()
        nodes[3].pause()
        started = time.monotonic()
        lease = lock.acquire(timeout=2.0)
        took = time.monotonic() - started
        assert took < 0.5  # a few node timeouts (0.1 s) at most, not the client's retries
        assert lease.remaining() > 9.0
        lease.extend()
        lease.release()
    finally:
        nodes[1].resume()
        nodes[3].resume()


def _idle(client: Any) -> list[Any]:
    """The sync driver's idle connections to this client's server."""
    pool = IO(client).pool
    assert pool is not None
    return pool.idle_connections()


def _owed(client: Any) -> list[int]:
    """The replies each idle driver connection to this client's server still owes."""
    return [conn.stale for conn in _idle(client)]


def test_a_majority_is_not_kept_waiting_by_the_slowest_nodes(
    nodes: list[servers.ServerProcess], clients: list[redis.Redis], name: str
) -> None:
    """Acquire and release return once a majority said yes, not after the stopped nodes'
    timeout; what those nodes owe is read and dropped before their next reply, so a
    later command on the same connections gets its own reply."""
    lock = redlease.Redlock(clients, name, ttl=10.0, node_timeout=3.0)
    lock.acquire().release()  # the servers are checked once, every node answering
    try:
        nodes[3].pause()
        nodes[4].pause()
        started = time.monotonic()
        lease = lock.acquire(timeout=1.0)
        lease.release()
        assert time.monotonic() - started < 1.5  # not one node_timeout
        # each owes the acquire and the release (and perhaps the warm-up's last reply)
        assert all(len(owed) == 1 and 2 <= owed[0] <= 3 for owed in map(_owed, clients[3:]))
    finally:
        nodes[3].resume()
        nodes[4].resume()
    # the stopped nodes now apply the acquire, then the release: nothing stays behind
    assert _released_everywhere(clients, name) == [0] * NODES
    # a single-server lock on node 3's client takes the connection that owes two replies
    other = redlease.Lock(clients[3], name + ":other", ttl=5.0).acquire(timeout=1.0)
    assert other.fence == _counter(clients[3], name + ":other")  # its own reply
    other.release()
    assert _owed(clients[3]) == [0]
    again = lock.acquire(timeout=1.0)
    assert again.fence > lease.fence
    again.release()


def test_a_stopped_node_owes_a_bounded_number_of_replies(
    nodes: list[servers.ServerProcess], clients: list[redis.Redis], name: str
) -> None:
    """A node that stays stopped is left unread up to MAX_STALE replies per connection;
    after that its reply is waited for (its timeout), and its connection dropped."""
    lock = redlease.Redlock(clients, name, ttl=10.0, node_timeout=0.1)
    lock.acquire().release()  # the servers are checked once, every node answering
    owed, took = [], []
    try:
        nodes[4].pause()
        for _ in range(5):
            started = time.monotonic()
            lock.acquire(timeout=1.0).release()
            took.append(time.monotonic() - started)
            owed.append(max(_owed(clients[4]), default=0))
    finally:
        nodes[4].resume()
    # one more owed per acquire and per release, up to the bound (where this starts
    # depends on whether the warm-up's last reply came in before the pause)
    assert _stale.MAX_STALE in owed
    assert max(owed) == _stale.MAX_STALE
    assert max(took) >= 0.1  # then a read waited out the node's timeout


def test_connections_that_cannot_owe_replies_are_read_in_full(
    nodes: list[servers.ServerProcess], name: str
) -> None:
    """Connections of a class redlease does not open itself (here a subclass of the
    user's) are used through their public methods: a fan-out reads every reply there, so
    a stopped node is waited for (its timeout) instead of being left owing."""

    # a subclass of the family's own connection class
    custom = type("Custom", (families.current().sync.Connection,), {})

    with ExitStack() as stack:
        made = [
            stack.enter_context(
                families.client(connection_pool=families.pool(connection_class=custom, port=p.port))
            )
            for p in nodes
        ]
        lock = redlease.Redlock(made, name, ttl=10.0, node_timeout=0.2)
        first = lock.acquire()
        first.release()
        assert [conn.lean for conn in _idle(made[0])] == [False]
        try:
            nodes[4].pause()
            started = time.monotonic()
            lock.acquire(timeout=1.0).release()
            assert time.monotonic() - started >= 0.2  # node 4 was waited for
        finally:
            nodes[4].resume()
        last = lock.acquire(timeout=1.0)
        assert last.fence > first.fence
        last.release()


def test_three_of_five_paused_is_a_quorum_error(
    nodes: list[servers.ServerProcess], clients: list[redis.Redis], name: str
) -> None:
    lock = redlease.Redlock(clients, name, ttl=10.0)
    paused = [0, 2, 4]
    try:
        for i in paused:
            nodes[i].pause()
        started = time.monotonic()
        with pytest.raises(redlease.QuorumError) as raised:
            lock.acquire(timeout=1.0)
        # retried until the timeout (the nodes may come back), then reported
        assert 0.8 <= time.monotonic() - started < 4.0
        failures = raised.value.failures
        assert sorted(failures) == sorted(f"localhost:{nodes[i].port}/0" for i in paused)
        assert all("did not answer in time" in why for why in failures.values())
        # nothing left behind on the nodes that answered
        assert _lock_keys([clients[1], clients[3]], name) == [0, 0]
    finally:
        for i in paused:
            nodes[i].resume()


def test_lost_replies_are_cleaned_up_by_release_all(
    nodes: list[servers.ServerProcess], name: str
) -> None:
    """The SET is applied on every node but three replies never arrive: not a majority,
    so QuorumError, and the release sent to all nodes removes all five keys."""
    with ExitStack() as stack:
        proxies = [stack.enter_context(FaultProxy("127.0.0.1", p.port).start()) for p in nodes]
        # The release goes out on new connections (the unanswered ones are dropped): it
        # gets through because the driver's connections need no handshake reply.
        via = [stack.enter_context(families.client(port=p.port)) for p in proxies]
        direct = [stack.enter_context(families.client(port=p.port)) for p in nodes]
        lock = redlease.Redlock(via, name, ttl=10.0, node_timeout=0.1)
        assert lock.try_acquire() is not None  # connects through the proxies first
        for c in direct:
            c.delete(lock_key(name))
        for proxy in proxies[:3]:
            proxy.set_mode("drop_replies")
        with pytest.raises(redlease.QuorumError):
            lock.try_acquire()
        deadline = time.monotonic() + 1.0
        while any(_lock_keys(direct, name)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _lock_keys(direct, name) == [0] * NODES
        for proxy in proxies:
            proxy.set_mode("pass")


def _forget_scripts(port: int) -> None:
    """The server at ``port`` as one never used: no scripts, and no library of functions."""
    with families.client(port=port) as direct:
        direct.script_flush()
        if int(str(direct.info("server")["redis_version"]).split(".")[0]) >= 7:
            direct.execute_command("FUNCTION", "FLUSH")


def test_first_acquire_over_a_slow_link_fits_the_node_timeout(
    nodes: list[servers.ServerProcess], name: str
) -> None:
    """200 ms round trips and a 0.5 s node timeout: a new connection and a script the
    server has never seen must cost one round trip, not three (a handshake, NOSCRIPT or
    "function not found")."""
    with ExitStack() as stack:
        proxies = [stack.enter_context(FaultProxy("127.0.0.1", p.port).start()) for p in nodes]
        for proxy in proxies:
            proxy.set_mode("delay", delay_ms=100)
        via = [stack.enter_context(families.client(port=p.port)) for p in proxies]
        for node in nodes:
            _forget_scripts(node.port)
        lock = redlease.Redlock(via, name, ttl=10.0, node_timeout=0.5)
        lease = lock.try_acquire()
        assert lease is not None
        lease.release()


async def test_async_first_acquire_over_a_slow_link_fits_the_node_timeout(
    nodes: list[servers.ServerProcess], name: str
) -> None:
    """The asyncio twin of the test above (redis-py 8's asyncio connections would spend
    HELLO 3, CLIENT SETINFO and CLIENT MAINT_NOTIFICATIONS round trips first)."""
    with ExitStack() as stack:
        proxies = [stack.enter_context(FaultProxy("127.0.0.1", p.port).start()) for p in nodes]
        for proxy in proxies:
            proxy.set_mode("delay", delay_ms=100)
        for node in nodes:
            _forget_scripts(node.port)
        via = [families.aclient(port=p.port) for p in proxies]
        try:
            lock = redlease.AsyncRedlock(via, name, ttl=10.0, node_timeout=0.5)
            lease = await lock.try_acquire()
            assert lease is not None
            await lease.release()
        finally:
            for client in via:
                await client.aclose()


def test_reply_lost_on_a_paused_node_is_released_after_resume(
    nodes: list[servers.ServerProcess], clients: list[redis.Redis], name: str
) -> None:
    """A paused node gets the SET but answers too late: the holder releases on every node,
    so once the node runs again, it applies the release after the SET and is clean."""
    lock = redlease.Redlock(clients[:3], name, ttl=10.0)
    try:
        nodes[0].pause()
        lease = lock.acquire(timeout=1.0)  # a majority without node 0
        lease.release()
    finally:
        nodes[0].resume()
    deadline = time.monotonic() + 2.0
    while _lock_keys(clients[:1], name) != [0] and time.monotonic() < deadline:
        time.sleep(0.01)
    # the acquire's SET (on a dropped connection) and the release reach node 0 in either
    # order; at worst the key stays until its ttl, never without one
    assert clients[0].pttl(lock_key(name)) != -1


def test_fences_increase_across_nodes_restarted_empty(
    nodes: list[servers.ServerProcess], name: str
) -> None:
    ports = [p.port for p in nodes[:3]]

    def cycle() -> int:
        with ExitStack() as stack:  # a new lock each time: it knows no earlier token
            fresh = [stack.enter_context(families.client(port=port)) for port in ports]
            lease = redlease.Redlock(fresh, name, ttl=5.0).acquire(timeout=2.0)
            lease.release()
            # a majority holds its token (a lagging node that was read is raised to it)
            assert sum(_counter(c, name) >= lease.fence for c in fresh) >= 2
            return lease.fence

    fences = [cycle(), cycle()]
    for proc in (nodes[0], nodes[1], nodes[2], nodes[0]):
        proc.restart()  # no persistence: the node comes back empty
        fences.append(cycle())
    assert fences == sorted(set(fences))


def test_a_node_restarted_empty_catches_up_at_the_next_acquisition(
    nodes: list[servers.ServerProcess], name: str
) -> None:
    """The lock passes the highest token it handed out with each acquire: a node that
    lost its counter is raised past it as soon as an acquire reaches it, whether or not
    its reply is read; and if every node lost its counter, this lock's tokens still
    increase."""
    ports = [p.port for p in nodes]

    def cycle(lock: redlease.Redlock) -> int:
        # the first use of a connection to a restarted node fails: that node is a "no"
        for _ in range(3):
            try:
                lease = lock.acquire(timeout=2.0)
            except redlease.QuorumError:
                continue
            lease.release()
            return lease.fence
        raise AssertionError("no majority after the restart")

    with ExitStack() as stack:
        fresh = [stack.enter_context(families.client(port=port)) for port in ports]
        lock = redlease.Redlock(fresh, name, ttl=5.0)
        fences = [cycle(lock) for _ in range(3)]
        nodes[4].restart()
        fences += [cycle(lock), cycle(lock)]
        # the second acquire after the restart reached node 4, which caught up: its new
        # counter starts at its clock, and a lagging one is raised
        assert all(_counter(c, name) >= fences[-1] for c in fresh)
        for proc in nodes:
            proc.restart()
        fences += [cycle(lock), cycle(lock)]
        assert fences == sorted(set(fences))


def test_fence_taken_from_the_majority_not_one_node(
    nodes: list[servers.ServerProcess], clients: list[redis.Redis], name: str
) -> None:
    """Counters that disagree (a node was down, another restarted) still give a token
    above every one handed out before."""
    lock = redlease.Redlock(clients[:3], name, ttl=5.0)
    try:
        nodes[2].pause()
        fence = 0
        for _ in range(3):  # nodes 0 and 1 move ahead, node 2 stays behind
            lease = lock.acquire(timeout=1.0)
            fence = lease.fence
            lease.release()
    finally:
        nodes[2].resume()
    nodes[0].restart()  # node 0 forgets; node 1 alone remembers, and any majority has it
    with ExitStack() as stack:
        fresh = [stack.enter_context(families.client(port=p.port)) for p in nodes[:3]]
        lease = redlease.Redlock(fresh, name, ttl=5.0).acquire(timeout=1.0)
        assert lease.fence > fence
        lease.release()


# -- mutual exclusion across processes ---------------------------------------------------------

_WORKER = textwrap.dedent(
    """
    import json, sys, time
    import redis, redlease

    ports, counter_port, name, rounds = json.loads(sys.argv[1])
    lock = redlease.Redlock([redis.Redis(port=p) for p in ports], name, ttl=2.0)
    counter = redis.Redis(port=counter_port)
    fences = []
    for _ in range(rounds):
        with lock as lease:
            value = int(counter.get("counter") or 0)
            time.sleep(0.001)
            counter.set("counter", value + 1)
            fences.append(lease.fence)
    print(json.dumps(fences))
    """
)


def test_processes_exclude_each_other(
    procs: list[servers.ServerProcess], nodes: list[servers.ServerProcess], name: str
) -> None:
    workers, rounds = 4, 25
    config = json.dumps([[p.port for p in nodes], procs[NODES].port, name, rounds])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    running = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, config], stdout=subprocess.PIPE, env=env, text=True
        )
        for _ in range(workers)
    ]
    outputs = [p.communicate(timeout=30)[0] for p in running]
    assert [p.returncode for p in running] == [0] * workers
    fences = [f for out in outputs for f in json.loads(out)]
    assert int(families.client(port=procs[NODES].port).get("counter") or 0) == workers * rounds
    assert len(set(fences)) == workers * rounds  # one token per holder, never reused


# -- arguments ----------------------------------------------------------------------------------


def test_bad_nodes(clients: list[redis.Redis], nodes: list[servers.ServerProcess]) -> None:
    with pytest.raises(redlease.InvalidArgument, match="nodes must not be empty"):
        redlease.Redlock([], "x")
    with pytest.raises(redlease.InvalidArgument, match="nodes must be a list"):
        redlease.Redlock(clients[0], "x")  # type: ignore[arg-type]
    with pytest.raises(redlease.InvalidArgument, match=r"nodes\[0\] and nodes\[1\]"):
        redlease.Redlock([clients[0], clients[0]], "x")
    again = families.client(port=nodes[1].port)  # another client, the same server
    with pytest.raises(redlease.InvalidArgument, match=r"nodes\[1\] and nodes\[2\]"):
        redlease.Redlock([clients[0], clients[1], again], "x")
    with pytest.raises(redlease.InvalidArgument, match=r"nodes\[1\] must be a redis-py or valkey"):
        redlease.Redlock([clients[0], "redis://x"], "x")
    mixed = [clients[0], families.aclient(port=nodes[1].port)]
    with pytest.raises(redlease.InvalidArgument, match="mixes sync and asyncio"):
        redlease.Redlock(mixed, "x")
    with pytest.raises(redlease.InvalidArgument, match="mixes sync and asyncio"):
        redlease.AsyncRedlock(mixed, "x")
    with pytest.raises(redlease.InvalidArgument, match="AsyncRedlock"):
        redlease.Redlock([mixed[1]], "x")
    with pytest.raises(
        redlease.InvalidArgument,
        match=r"asyncio clients \(redis\.asyncio, valkey\.asyncio\) for AsyncRedlock",
    ):
        redlease.AsyncRedlock(clients[:1], "x")


def test_bad_arguments(clients: list[redis.Redis]) -> None:
    with pytest.raises(redlease.InvalidArgument, match="ttl"):
        redlease.Redlock(clients, "x", ttl=0)
    with pytest.raises(redlease.InvalidArgument, match="name"):
        redlease.Redlock(clients, "")
    with pytest.raises(redlease.InvalidArgument, match="node_timeout"):
        redlease.Redlock(clients, "x", node_timeout=-1)
    with pytest.raises(redlease.InvalidArgument, match="timeout"):
        redlease.Redlock(clients, "x").acquire(timeout=-1)


def test_deliberately_unsafe_variants_are_wired(clients: list[redis.Redis]) -> None:
    half = unsafe_redlock(redlease.Redlock, Unsafe(half_quorum=True))(clients, "x")
    assert half.quorum == 2  # wrong on purpose: two disjoint "majorities" of five
    spec = QuorumSpec.create(
        redlease.Redlock(clients, "x")._core.spec,
        ["a"] * 5,
        None,
        Unsafe(release_believed_only=True),
    )
    attempt = QuorumAcquisition(spec, 0.0, wait=False)
    flow = attempt.run()
    next(flow)
    yes, held = _yes(1), [0, 0, 500]
    lost: Exception = redlease.BackendError("gone")
    fan = flow.send([yes, yes, held, held, lost])  # no majority: release follows
    assert isinstance(fan, Fanout)
    assert fan.nodes == (0, 1)  # only where it believes; a correct one includes node 4


def test_auto_renew_keeps_a_majority_lease(clients: list[redis.Redis], name: str) -> None:
    lock = redlease.Redlock(clients[:3], name, ttl=0.3, auto_renew=True)
    with lock as lease:
        time.sleep(0.7)
        assert not lease.lost
        assert lease.remaining() > 0.05
    assert _released_everywhere(clients[:3], name) == [0, 0, 0]


def _lost_reason(lease: Any) -> str:
    with pytest.raises(redlease.LockLost) as caught:
        lease.check()
    return str(caught.value)


@pytest.mark.parametrize("taken", [1, 2])
def test_renewal_counts_a_majority_like_extend(
    clients: list[redis.Redis], name: str, taken: int
) -> None:
    """The renewer judges a Redlock renewal by the lease's own extend rule: a node taken
    over is outvoted by the other two; a majority taken over is a loss, told at the next
    renewal (ttl/3), not when validity runs out."""
    seen: list[Any] = []
    lock = redlease.Redlock(clients[:3], name, ttl=3.0, auto_renew=True, on_lost=seen.append)
    lease = lock.acquire()
    for client in clients[:taken]:
        client.set(lock_key(name), "another holder", px=60_000)
    deadline = time.monotonic() + 2.5  # validity would run out at 3 s
    while time.monotonic() < deadline and not seen:
        time.sleep(0.05)
    if taken == 1:
        assert not lease.lost
        assert lease.remaining() > 1.5  # renewed at 1 s and 2 s
        lease.release()
    else:
        assert seen == [lease]
        assert "majority" in _lost_reason(lease)


def test_renewal_outlasts_one_stopped_node_and_not_two(
    nodes: list[servers.ServerProcess], clients: list[redis.Redis], name: str
) -> None:
    """With one of three nodes stopped a majority still renews; with two, renewals fail
    (too few answered: retried, not a loss) until the validity runs out."""
    one = redlease.Redlock(clients[:3], name, ttl=0.6, auto_renew=True).acquire()
    nodes[0].pause()
    time.sleep(1.0)
    assert not one.lost
    one.release()
    two = redlease.Redlock(clients[:3], f"{name}:2", ttl=0.6, auto_renew=True).acquire()
    nodes[1].pause()
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and not two.lost:
        time.sleep(0.05)
    assert "renewals failed until its validity ran out" in _lost_reason(two)


async def test_async_renewal_counts_a_majority_like_extend(
    nodes: list[servers.ServerProcess], clients: list[redis.Redis], name: str
) -> None:
    made = [families.aclient(port=p.port) for p in nodes[:3]]
    seen: list[Any] = []
    told = asyncio.Event()

    def on_lost(lease: Any) -> None:
        seen.append(lease)
        told.set()

    try:
        lock = redlease.AsyncRedlock(made, name, ttl=3.0, auto_renew=True, on_lost=on_lost)
        lease = await lock.acquire()
        for other in clients[:2]:
            other.set(lock_key(name), "another holder", px=60_000)
        await asyncio.wait_for(told.wait(), 2.5)  # validity would run out at 3 s
        assert seen == [lease]
        assert "majority" in _lost_reason(lease)
    finally:
        for node in made:
            await node.aclose()


# -- asyncio ------------------------------------------------------------------------------------


async def test_async_twin(nodes: list[servers.ServerProcess], name: str) -> None:
    made = [families.aclient(port=p.port) for p in nodes[:3]]
    try:
        lock = redlease.AsyncRedlock(made, name, ttl=5.0)
        async with lock as lease:
            assert lease.fence >= 1
            assert await lock.try_acquire() is None
            await lease.extend(6.0)
            assert 5.8 < lease.remaining() <= 6.0
        second = await lock.acquire(timeout=1.0)
        assert second.fence > lease.fence
        await second.release()
        assert [await c.exists(lock_key(name)) for c in made] == [0, 0, 0]
    finally:
        for c in made:
            await c.aclose()


async def test_async_a_majority_is_not_kept_waiting_by_the_slowest_nodes(
    nodes: list[servers.ServerProcess], name: str
) -> None:
    made = [families.aclient(port=p.port) for p in nodes]
    lock = redlease.AsyncRedlock(made, name, ttl=10.0, node_timeout=3.0)
    try:
        await (await lock.acquire()).release()  # the servers are checked once
        nodes[3].pause()
        nodes[4].pause()
        started = time.monotonic()
        lease = await lock.acquire(timeout=1.0)
        await lease.release()
        assert time.monotonic() - started < 1.5  # not one node_timeout
        pool = AsyncIO(made[3]).pool
        assert pool is not None
        idle = pool.idle_connections()
        assert len(idle) == 1
        assert 2 <= idle[0].stale <= 3
        nodes[3].resume()
        nodes[4].resume()
        other = await redlease.AsyncLock(made[3], name + ":other", ttl=5.0).acquire(timeout=1.0)
        # its own reply, not one of the two owed
        assert other.fence == int(await made[3].get(_fence_key(name + ":other")) or 0)
        await other.release()
        again = await lock.acquire(timeout=1.0)
        assert again.fence > lease.fence
        await again.release()
    finally:
        for proc in nodes:
            proc.resume()
        for c in made:
            await c.aclose()


async def test_async_minority_paused_and_majority_paused(
    nodes: list[servers.ServerProcess], name: str
) -> None:
    made = [families.aclient(port=p.port) for p in nodes]
    lock = redlease.AsyncRedlock(made, name, ttl=10.0)
    try:
        nodes[0].pause()
        nodes[1].pause()
        started = time.monotonic()
        lease = await lock.acquire(timeout=2.0)
        assert time.monotonic() - started < 0.5
        await lease.release()
        nodes[2].pause()
        with pytest.raises(redlease.QuorumError) as raised:
            await lock.acquire(timeout=1.0)
        assert len(raised.value.failures) == 3
        assert [await c.exists(lock_key(name)) for c in made[3:]] == [0, 0]
    finally:
        for proc in nodes[:3]:
            proc.resume()
        for c in made:
            await c.aclose()


async def test_async_cancelled_acquire_leaves_nothing(
    nodes: list[servers.ServerProcess], name: str
) -> None:
    made = [families.aclient(port=p.port) for p in nodes[:3]]
    try:
        lock = redlease.AsyncRedlock(made, name, ttl=5.0)
        holder = await lock.acquire()
        waiter = asyncio.ensure_future(lock.acquire())
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await holder.release()
        assert [await c.exists(lock_key(name)) for c in made] == [0, 0, 0]
    finally:
        for c in made:
            await c.aclose()


@pytest.mark.parametrize("turns", [1, 2, 3, 6])
async def test_async_cancelled_release_still_releases_everywhere(
    nodes: list[servers.ServerProcess], name: str, turns: int
) -> None:
    """Cancelled a few loop turns into its fan-out (some nodes sent, some answered), the
    release still runs to its end on every node."""
    made = [families.aclient(port=p.port) for p in nodes[:3]]
    try:
        lease = await redlease.AsyncRedlock(made, name, ttl=30.0).acquire()
        release = asyncio.ensure_future(lease.release())
        for _ in range(turns):
            await asyncio.sleep(0)
        release.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await release
        assert lease.released
        assert [await c.exists(lock_key(name)) for c in made] == [0, 0, 0]
    finally:
        for c in made:
            await c.aclose()
