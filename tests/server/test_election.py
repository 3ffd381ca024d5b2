"""``Election`` and ``AsyncElection`` on real servers: one leader at a time with strictly
increasing terms, hand-over on resign, take-over after a leader killed with -9, a leader
told of its loss before a successor leads, observers woken by the server, cancellation,
bad input, keys with TTLs; and several processes campaigning at once."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import redlease
from redlease import Leader
from redlease._rules.keys import LockKeys
from redlease.tools import servers
from waiting_helpers import until_queued, wait_until


def queued(r: redis.Redis, name: str) -> int:
    return int(r.llen(LockKeys.for_election(name).queue))


def election_keys(r: redis.Redis, name: str) -> list[bytes]:
    base = LockKeys.for_election(name).lock
    return list(r.scan_iter(match=base.replace("{", "[{]") + "*"))


_OBSERVERS: list[Observer] = []


@pytest.fixture(autouse=True)
def _observers_stop() -> Iterator[None]:
    """Every observer a test started is closed, and its thread done, when the test ends."""
    yield
    while _OBSERVERS:
        observer = _OBSERVERS.pop()
        observer.observation.close()
        observer.thread.join(30)
        assert not observer.thread.is_alive()


class Observer:
    """``observe()`` in a thread, each leader seen with when."""

    def __init__(self, election: redlease.Election) -> None:
        self.seen: list[tuple[float, Leader | None]] = []
        self.observation = election.observe()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        _OBSERVERS.append(self)

    def _run(self) -> None:
        for leader in self.observation:
            self.seen.append((time.monotonic(), leader))

    def leaders(self) -> list[Leader | None]:
        return [leader for _, leader in self.seen]


def test_campaign_leader_and_hand_over_on_resign(r: redis.Redis, name: str) -> None:
    alpha = redlease.Election(r, name, ttl=10.0, identity="alpha")
    beta = redlease.Election(r, name, ttl=10.0, identity="beta")
    assert alpha.leader() is None
    lease = alpha.campaign(timeout=1)
    assert alpha.campaign() is lease  # leading already
    assert beta.leader() == Leader("alpha", lease.fence)
    with pytest.raises(redlease.AcquireTimeout, match="election"):
        beta.campaign(timeout=0.1)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(beta.campaign(timeout=60)))
    thread.start()
    wait_until(lambda: queued(r, name) == 1)
    resigned = time.monotonic()
    alpha.resign()
    thread.join(60)
    assert time.monotonic() - resigned < 5  # at once, not after a ttl
    assert lease.released
    assert got[0].fence > lease.fence  # a new term
    assert alpha.leader() == Leader("beta", got[0].fence)
    beta.resign()
    beta.resign()  # not leading: nothing to do
    assert alpha.leader() is None


def test_observers_see_each_change(r: redis.Redis, name: str) -> None:
    watcher = Observer(redlease.Election(r, name, ttl=10.0))
    wait_until(lambda: len(watcher.seen) == 1)
    alpha = redlease.Election(r, name, ttl=10.0, identity="alpha")
    beta = redlease.Election(r, name, ttl=10.0, identity="beta")
    first = alpha.campaign(timeout=1)
    wait_until(lambda: len(watcher.seen) == 2)  # woken by the server: ttl is 10 s
    alpha.resign()
    wait_until(lambda: len(watcher.seen) == 3)
    second = beta.campaign(timeout=1)
    wait_until(lambda: len(watcher.seen) == 4)
    beta.resign()
    wait_until(lambda: len(watcher.seen) == 5)
    assert watcher.leaders() == [
        None,
        Leader("alpha", first.fence),
        None,
        Leader("beta", second.fence),
        None,
    ]
    key = LockKeys.for_election(name).lock + ":observers"
    assert r.pttl(key) > 0


_CANDIDATE = """
import sys, time, redis, redlease
port, name, identity = int(sys.argv[1]), sys.argv[2], sys.argv[3]
election = redlease.Election(redis.Redis(port=port), name, ttl=1.0, identity=identity)
lease = election.campaign()
print(lease.fence, flush=True)
time.sleep(600)
"""


def test_a_killed_leader_is_followed_within_its_ttl(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    dead = subprocess.Popen(
        [sys.executable, "-c", _CANDIDATE, str(server.port), name, "doomed"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert dead.stdout is not None
    term = int(dead.stdout.readline())
    watcher = Observer(redlease.Election(r, name, ttl=1.0))
    heir = redlease.Election(r, name, ttl=1.0, identity="heir")
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(heir.campaign(timeout=60)))
    thread.start()
    wait_until(lambda: queued(r, name) == 1)
    killed = time.monotonic()
    dead.send_signal(signal.SIGKILL)
    dead.wait(30)
    dead.stdout.close()
    thread.join(60)
    assert time.monotonic() - killed < 1.0 + 5  # the ttl, and a generous round trip
    assert got[0].fence > term
    wait_until(lambda: Leader("heir", got[0].fence) in watcher.leaders())
    assert Leader("doomed", term) in watcher.leaders()
    heir.resign()


def test_a_dead_leader_without_heir_is_seen_gone(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    dead = subprocess.Popen(
        [sys.executable, "-c", _CANDIDATE, str(server.port), name, "doomed"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert dead.stdout is not None
    dead.stdout.readline()
    watcher = Observer(redlease.Election(r, name, ttl=1.0))
    wait_until(lambda: len(watcher.seen) == 1)
    dead.send_signal(signal.SIGKILL)
    dead.wait(30)
    dead.stdout.close()
    wait_until(lambda: len(watcher.seen) == 2, timeout=30)  # when its lease runs out
    assert watcher.leaders()[-1] is None


def test_a_leader_is_told_it_lost_before_a_successor_leads(server_kind: str, name: str) -> None:
    """The server stops answering the leader's renewals (paused past the ttl): the
    leader hears of its loss by the end of its validity, before the lease runs out on
    the server, which is what lets the next candidate in."""
    with servers.ServerProcess(servers.find_binary(server_kind)) as own:
        told: list[float] = []
        leader_client, heir_client = redis.Redis(port=own.port), redis.Redis(port=own.port)
        first = redlease.Election(
            leader_client, name, ttl=1.0, on_lost=lambda _: told.append(time.monotonic())
        )
        lease = first.campaign(timeout=1)
        heir = redlease.Election(heir_client, name, ttl=1.0, identity="heir")
        got: list[tuple[float, Any]] = []

        def campaign() -> None:
            lease = heir.campaign(timeout=60)
            got.append((time.monotonic(), lease))

        thread = threading.Thread(target=campaign)
        thread.start()
        wait_until(lambda: redis.Redis(port=own.port).llen(LockKeys.for_election(name).queue))
        own.pause()
        time.sleep(2.0)  # the leader's renewals go unanswered
        own.resume()
        thread.join(60)
        assert lease.lost
        assert told
        assert told[0] < got[0][0]
        assert got[0][1].fence > lease.fence
        heir.resign()
        leader_client.close()
        heir_client.close()


async def test_async_election(ar: aredis.Redis, r: redis.Redis, name: str) -> None:
    alpha = redlease.AsyncElection(ar, name, ttl=10.0, identity="alpha")
    beta = redlease.AsyncElection(ar, name, ttl=10.0, identity="beta")
    seen: list[Leader | None] = []

    async def watch() -> None:
        async for leader in redlease.AsyncElection(ar, name, ttl=10.0).observe():
            seen.append(leader)

    watcher = asyncio.create_task(watch())
    lease = await alpha.campaign(timeout=1)
    assert await beta.leader() == Leader("alpha", lease.fence)
    waiting = asyncio.create_task(beta.campaign(timeout=60))
    await until_queued(lambda: queued(r, name))
    await alpha.resign()
    second = await asyncio.wait_for(waiting, 30)
    assert second.fence > lease.fence
    for _ in range(2000):
        if Leader("beta", second.fence) in seen:
            break
        await asyncio.sleep(0.005)
    assert Leader("beta", second.fence) in seen
    await beta.resign()
    watcher.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watcher


async def test_an_async_observation_ends_when_closed(ar: aredis.Redis, name: str) -> None:
    """``close()`` from another task ends an ``async for`` waiting for a change at once (not
    after a ttl), as it does for the sync twin; ``aclose()`` and leaving ``async with``
    end it too, and a closed observation yields nothing more."""
    election = redlease.AsyncElection(ar, name, ttl=60.0)
    seen: list[Leader | None] = []
    async with election.observe() as changes:

        async def watch() -> None:
            async for leader in changes:
                seen.append(leader)

        watcher = asyncio.create_task(watch())
        await until_queued(lambda: len(seen))  # the first look: nobody leads
        await asyncio.sleep(0.2)  # now waiting for a ring
        closed = time.monotonic()
        changes.close()
        await asyncio.wait_for(watcher, 30)
        assert time.monotonic() - closed < 10  # at once, not after the 60 s ttl
    assert seen == [None]
    other = election.observe()
    assert await other.__anext__() is None
    await other.aclose()
    with pytest.raises(StopAsyncIteration):
        await other.__anext__()
    async with election.observe() as third:
        pass
    assert [leader async for leader in third] == []


async def test_a_cancelled_candidate_leaves_nothing(
    ar: aredis.Redis, r: redis.Redis, name: str
) -> None:
    leader = redlease.AsyncElection(ar, name, ttl=10.0, identity="leader")
    lease = await leader.campaign(timeout=1)
    candidate = redlease.AsyncElection(ar, name, ttl=10.0, identity="candidate")
    waiting = asyncio.create_task(candidate.campaign(timeout=60))
    await until_queued(lambda: queued(r, name))
    await leader.resign()  # granted to the candidate...
    waiting.cancel()  # ...which is cancelled before it hears of it
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await candidate.leader() is None  # given back
    assert lease.released


async def test_a_candidate_cancelled_while_it_announces_hands_leadership_on(
    ar: aredis.Redis, r: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Granted, then cancelled while it tells the observers: the caller never had the
    lease, so it must not lead (it did, renewed for good, until this was fixed)."""
    announcing = asyncio.Event()
    tell = redlease.AsyncElection._tell

    async def slow_tell(self: redlease.AsyncElection, what: str) -> None:
        if what == "elected":
            announcing.set()
            await asyncio.sleep(60)
        await tell(self, what)

    monkeypatch.setattr(redlease.AsyncElection, "_tell", slow_tell)
    candidate = redlease.AsyncElection(ar, name, ttl=10.0, identity="candidate")
    waiting = asyncio.create_task(candidate.campaign(timeout=60))
    await asyncio.wait_for(announcing.wait(), 30)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await candidate.leader() is None
    other = redlease.AsyncElection(ar, name, ttl=10.0, identity="other")
    monkeypatch.setattr(redlease.AsyncElection, "_tell", tell)
    assert (await other.campaign(timeout=5)).fence > 0  # free for the next one at once
    await other.resign()


def test_a_candidate_interrupted_while_it_announces_hands_leadership_on(
    r: redis.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tell = redlease.Election._tell

    def interrupted(self: redlease.Election, what: str) -> None:
        if what == "elected":
            raise KeyboardInterrupt
        tell(self, what)

    monkeypatch.setattr(redlease.Election, "_tell", interrupted)
    candidate = redlease.Election(r, name, ttl=10.0, identity="candidate")
    with pytest.raises(KeyboardInterrupt):
        candidate.campaign(timeout=5)
    assert candidate.leader() is None


def test_a_candidate_interrupted_as_the_process_goes_away_resigns_in_haste(
    binary: servers.ServerBinary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the new leader announces itself, the server hung from then on: the
    leadership is given back within half a second (what the server keeps expires with
    the ttl), not waited for a ttl and more."""
    with servers.ServerProcess(binary) as proc:
        client = redis.Redis(port=proc.port, socket_timeout=60)
        tell = redlease.Election._tell

        def interrupted(self: redlease.Election, what: str) -> None:
            if what == "elected":
                proc.pause()  # the server hangs from here on
                raise KeyboardInterrupt
            tell(self, what)

        monkeypatch.setattr(redlease.Election, "_tell", interrupted)
        candidate = redlease.Election(client, "leader", ttl=10.0, identity="candidate")
        started = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                candidate.campaign(timeout=5)
            took = time.monotonic() - started
        finally:
            proc.resume()
        client.close()
    assert took < 3.0


def test_bad_arguments_are_named(r: redis.Redis, ar: aredis.Redis, name: str) -> None:
    for identity in ("", 5, b"x", "x" * 257, "\ud800"):
        with pytest.raises(redlease.InvalidArgument, match="identity"):
            redlease.Election(r, name, identity=identity)  # type: ignore[arg-type]
    with pytest.raises(redlease.InvalidArgument, match="ttl"):
        redlease.Election(r, name, ttl=0)
    with pytest.raises(redlease.InvalidArgument, match="AsyncElection"):
        redlease.AsyncElection(r, name)
    with pytest.raises(redlease.InvalidArgument, match="timeout"):
        redlease.Election(r, name).campaign(timeout=-1)
    assert redlease.Election(r, name).identity  # "host:pid" by default
    assert redlease.Election(r, name, identity="é" * 128).identity == "é" * 128


def test_a_long_reign_keeps_its_term_and_every_key_a_ttl(r: redis.Redis, name: str) -> None:
    election = redlease.Election(r, name, ttl=0.5, identity="x")
    watcher = Observer(redlease.Election(r, name, ttl=0.5))
    wait_until(lambda: len(watcher.seen) == 1)
    lease = election.campaign(timeout=1)
    wait_until(lambda: len(watcher.seen) == 2)
    time.sleep(3.0)  # past what a grant alone keeps the term's counter for (2 s)
    assert election.leader() == Leader("x", lease.fence)
    assert watcher.leaders() == [None, Leader("x", lease.fence)]  # no change seen
    keys = election_keys(r, name)
    assert len(keys) == 3  # the lock, its fence counter (the term), the observers
    assert all(r.pttl(k) > 0 for k in keys), {k: r.pttl(k) for k in keys}
    election.resign()
    wait_until(lambda: len(watcher.seen) == 3)
    assert all(r.pttl(k) > 0 for k in election_keys(r, name))


_RIVAL = """
import json, random, sys, time, redis, redlease
port, name, identity, seconds = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
election = redlease.Election(redis.Redis(port=port), name, ttl=5.0, identity=identity)
terms = []
end = time.monotonic() + seconds
while time.monotonic() < end:
    lease = election.campaign(timeout=60)
    start = time.monotonic()
    time.sleep(random.uniform(0, 0.01))
    lease.check()
    terms.append([lease.fence, start, time.monotonic()])
    election.resign()
print(json.dumps(terms))
"""


def test_processes_never_share_a_term_and_terms_increase(
    server: servers.ServerProcess, name: str
) -> None:
    rivals = [
        subprocess.Popen(
            [sys.executable, "-c", _RIVAL, str(server.port), name, f"p{i}", "3"],
            stdout=subprocess.PIPE,
        )
        for i in range(5)
    ]
    terms = [t for w in rivals for t in json.loads(w.communicate(timeout=120)[0])]
    assert all(w.returncode == 0 for w in rivals)
    assert len(terms) > 10
    assert len({t[0] for t in terms}) == len(terms)  # never two leaders of one term
    terms.sort()
    for (_, _, ended), (_, began, _) in itertools.pairwise(terms):
        assert began > ended  # a higher term leads only after the lower one stopped


def test_an_election_is_apart_from_a_lock_of_its_name(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=10.0)
    election = redlease.Election(r, name, ttl=10.0, identity="x")
    with lock:
        lease = election.campaign(timeout=1)
        assert election.leader() == Leader("x", lease.fence)
        election.resign()


def test_an_observer_waits_out_a_server_restart(server_kind: str, name: str) -> None:
    with servers.ServerProcess(servers.find_binary(server_kind)) as own:
        client = redis.Redis(port=own.port)
        watcher = Observer(redlease.Election(client, name, ttl=1.0))
        wait_until(lambda: len(watcher.seen) == 1)
        own.kill()
        time.sleep(0.5)  # the observer meets a server that is down
        own.restart()
        lease = redlease.Election(client, name, ttl=1.0, identity="after").campaign(timeout=5)
        wait_until(lambda: Leader("after", lease.fence) in watcher.leaders(), timeout=30)
        assert watcher.thread.is_alive()
        client.close()


def test_closing_an_observation_ends_it_at_once(r: redis.Redis, name: str) -> None:
    watcher = Observer(redlease.Election(r, name, ttl=30.0))
    wait_until(lambda: len(watcher.seen) == 1)
    time.sleep(0.2)  # it waits now (for up to the ttl)
    closed = time.monotonic()
    watcher.observation.close()
    watcher.thread.join(30)
    assert not watcher.thread.is_alive()
    assert time.monotonic() - closed < 5  # not the ttl: the wait is woken
    with pytest.raises(StopIteration):
        next(watcher.observation)
