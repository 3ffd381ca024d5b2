"""asyncio cancellation at each await of an acquisition or a release leaves no lock
behind that the caller does not know about. The cancellation is delivered while an
operation is in flight (written, reply not yet read): the hardest case, because the
server may have applied it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aredis

import families
import redlease
from redlease._async.io import AsyncIO
from waiting_helpers import lock_key, script_calls


class CancelDuring(AsyncIO):
    """The real driver, except that the ``at``-th operation is cancelled in flight."""

    def __init__(self, client: Any, at: int) -> None:
        super().__init__(client)
        self.at, self.seen = at, 0

    async def execute(self, op: Any) -> Any:
        self.seen += 1
        if self.seen == self.at:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # lands at the first await inside the operation
        return await super().execute(op)


async def lock_state(ar: aredis.Redis, name: str) -> tuple[Any, int]:
    tag = lock_key(name)
    return (await ar.get(tag), await ar.llen(tag + ":line"))


@pytest.mark.parametrize(
    ("busy", "at"),
    [(False, 1), (True, 1), (True, 2)],
    ids=["free-in-acquire-script", "busy-in-acquire-script", "busy-in-wait"],
)
async def test_cancelled_acquire_leaves_nothing_behind(
    ar: aredis.Redis, name: str, busy: bool, at: int
) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0)
    holder = await lock.acquire() if busy else None
    lock._io = CancelDuring(ar, at)
    with pytest.raises(asyncio.CancelledError):
        await lock.acquire(timeout=10)
    value, queue_len = await lock_state(ar, name)
    assert queue_len == 0
    if holder is None:
        assert value is None  # the lock that was set in flight was released again
    else:
        assert value == holder.token.encode()
        await holder.release()
        assert (await lock_state(ar, name))[0] is None  # nothing was handed to the ghost


async def test_cancelled_while_the_grant_arrives(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0)
    for _ in range(20):
        holder = await lock.acquire()
        waiter = asyncio.ensure_future(lock.acquire(timeout=10))
        for _ in range(10_000):  # until the waiter is queued
            if (await lock_state(ar, name))[1]:
                break
            await asyncio.sleep(0.001)
        await holder.release()  # grants the lock to the waiter...
        waiter.cancel()  # ...which is cancelled as (or just after) the grant arrives
        try:
            lease = await waiter
        except asyncio.CancelledError:
            assert (await lock_state(ar, name))[0] is None  # given back, nobody holds it
        else:
            await lease.release()  # the grant won the race and reached the caller
        assert (await lock_state(ar, name))[1] == 0


async def test_cancelled_release_still_releases(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0)
    lease = await lock.acquire()
    lease._io = CancelDuring(ar, 1)
    with pytest.raises(asyncio.CancelledError):
        await lease.release()
    assert (await lock_state(ar, name))[0] is None


async def test_a_lease_two_tasks_release_at_once_is_released_by_one_script(
    ar: aredis.Redis, r: Any, name: str
) -> None:
    """A lease handed to another task (an election's leadership is handed to every task
    that campaigns on the same object) and released by both at once: one release is
    sent, the other waits for its end. Two scripts, on two connections, could reach the
    server in either order, and the later one, run after the next holder's own release,
    would find the name gone and raise LockLost to a holder that did nothing wrong."""
    lock = redlease.AsyncLock(ar, name, ttl=30.0)

    def scripts_run() -> int:
        return script_calls(r.info("commandstats"))

    for _ in range(10):
        lease = await lock.acquire()
        before = scripts_run()
        first = asyncio.ensure_future(lease.release())
        await asyncio.sleep(0)  # the first release is on its way
        await lease.release()  # the second returns once the first has ended
        assert not await lock.locked()
        await first
        assert scripts_run() - before == 1 + 1  # one release, and the look of locked()


async def test_cancelled_async_with_releases(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0)
    entered = asyncio.Event()

    async def body() -> None:
        async with lock:
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.ensure_future(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await lock_state(ar, name))[0] is None


async def test_wait_for_timeout_around_acquire(ar: aredis.Redis, name: str) -> None:
    lock = redlease.AsyncLock(ar, name, ttl=30.0)
    holder = await lock.acquire()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(lock.acquire(), 0.2)
    assert (await lock_state(ar, name))[1] == 0
    await holder.release()
    assert (await lock_state(ar, name))[0] is None


# -- An acquire that reaches the server after its own clean-up --------------------------
#
# A cancelled acquire's connection is dropped with its script in flight, and the clean-up
# goes out on another connection: nothing orders the two. The proxy holds what was sent
# on the connection open when the acquire began, so the server runs the clean-up first
# and the acquire after it, every time: the acquire must then take nothing.


def _primitives(client: Any, name: str) -> dict[str, Any]:
    """Per primitive: (a coroutine function that takes it, the kind read_info reads)."""
    rw = redlease.AsyncReadWriteLock(client, name, ttl=30.0)
    multi = redlease.AsyncMultiLock(client, [name, name + ":2"], ttl=30.0)
    election = redlease.AsyncElection(client, name, ttl=30.0, identity="node-a")
    job = redlease.AsyncOnce(client, name, at_most=30.0, every=3600.0)
    return {
        "lock": (redlease.AsyncLock(client, name, ttl=30.0).acquire, "lock"),
        "unfair-lock": (redlease.AsyncLock(client, name, ttl=30.0, fair=False).acquire, "lock"),
        "semaphore": (
            redlease.AsyncSemaphore(client, name, limit=2, ttl=30.0).acquire,
            "semaphore",
        ),
        "read": (rw.read.acquire, "rwlock"),
        "write": (rw.write.acquire, "rwlock"),
        "multilock": (multi.acquire, "lock"),
        "election": (election.campaign, "election"),
        "once-every": (job.begin, "lock"),
    }


_PRIMITIVES = ("lock", "unfair-lock", "semaphore", "read", "write", "multilock", "election")


@pytest.mark.parametrize("primitive", [*_PRIMITIVES, "once-every"])
async def test_an_acquire_landing_after_its_clean_up_takes_nothing(
    server: Any, family: Any, r: Any, name: str, primitive: str
) -> None:
    from redlease.tools.chaos.proxy import FaultProxy

    with FaultProxy("127.0.0.1", server.port) as proxy:
        client = family.aclient(port=proxy.port)
        try:
            # one connection in redlease's pool, through the proxy (the server looked at)
            await (await redlease.AsyncLock(client, name + ":warm", ttl=30.0).acquire()).release()
            take, kind = _primitives(client, name)[primitive]
            proxy.hold_open()
            task = asyncio.ensure_future(take())
            for _ in range(5000):  # until the acquire is on its way, held
                if proxy.stats.holding:
                    break
                await asyncio.sleep(0.001)
            assert proxy.stats.holding, "the acquire never left"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task  # its clean-up went out on a new connection, and ran
            assert not redlease.read_info(r, name, kind=kind).held
            proxy.let_go()  # now the acquire reaches the server
            for _ in range(5000):
                if not proxy.stats.holding:
                    break
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.3)
            assert not redlease.read_info(r, name, kind=kind).held
            assert r.get(lock_key(name) + ":once") is None  # no period used up
            if primitive == "election":
                assert r.get(lock_key(name) + ":elect") is None  # nobody leads
        finally:
            await client.aclose()


@pytest.mark.parametrize("primitive", ["lock", "semaphore"])
async def test_a_try_landing_after_its_grant_was_released_takes_nothing(
    server: Any, family: Any, r: Any, name: str, primitive: str
) -> None:
    """The first try goes unanswered (held up on its connection) and times out; the
    next one, on a new connection, is granted; the lease is used and released; then the
    first try lands. It must not take the name (held for nobody) nor queue it."""
    from redlease.tools.chaos.proxy import FaultProxy

    with FaultProxy("127.0.0.1", server.port) as proxy:
        client = family.aclient(port=proxy.port)
        try:
            await (await redlease.AsyncLock(client, name + ":warm", ttl=30.0).acquire()).release()
            # (a ttl of 1 s: its tries' replies are waited for 1 s)
            take, kind = {
                "lock": (redlease.AsyncLock(client, name, ttl=1.0).acquire, "lock"),
                "semaphore": (
                    redlease.AsyncSemaphore(client, name, limit=2, ttl=1.0).acquire,
                    "semaphore",
                ),
            }[primitive]
            proxy.hold_open()
            lease = await take(timeout=10)  # its first try timed out after 1 s; the next won
            assert proxy.stats.holding, "the first try was not held up"
            await lease.release()
            proxy.let_go()  # now the first try reaches the server
            for _ in range(5000):
                if not proxy.stats.holding:
                    break
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.3)
            info = redlease.read_info(r, name, kind=kind)
            assert not info.held
            assert info.waiters == ()
        finally:
            await client.aclose()


# -- Cancelled at random moments, against a server other clients keep busy ---------------

# About a millisecond of server time per run: the other clients' scripts, between which
# each of ours waits its turn (so a cancellation finds it in flight more often).
_BUSY = "local n = 0 for i = 1, 100000 do n = n + i end return n"


class _BusyServer:
    """Other clients' scripts, back to back, on a connection of their own."""

    def __init__(self, port: int) -> None:
        import threading

        self.client = families.client(port=port)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.client.eval(_BUSY, 0)

    def __enter__(self) -> _BusyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.client.close()


async def _cancelled_at_random(take: Any, tries: int, tasks: int, seed: int) -> list[Any]:
    """``tries`` takes in all by ``tasks`` tasks, each cut short at a random moment of its
    first 3 ms (before its script is sent, in flight, after the reply); what was taken
    is given back. The runs (leases) that reached their caller."""
    import random

    rng = random.Random(seed)
    reached: list[Any] = []

    async def one(count: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(count):
            task = asyncio.ensure_future(take())
            timer = loop.call_later(rng.uniform(0.0, 0.003), task.cancel)
            try:
                got = await task
            except asyncio.CancelledError:
                continue
            finally:
                timer.cancel()
            if isinstance(got, redlease.Skipped):
                continue
            reached.append(got)
            await got.release()

    await asyncio.gather(*(one(tries // tasks) for _ in range(tasks)))
    return reached


@pytest.mark.parametrize("primitive", [*_PRIMITIVES, "once"])
async def test_cancelled_at_random_moments_leaves_nothing_behind(
    server: Any, ar: aredis.Redis, r: Any, name: str, primitive: str
) -> None:
    names = [f"{name}:{i}" for i in range(10)]  # shared by the tasks: some wait
    picked = iter(range(1 << 30))
    made = {n: _primitives(ar, n) for n in names}

    async def take() -> Any:
        n = names[next(picked) % len(names)]
        if primitive == "once":  # every=: a period used up by a run that never began shows
            job = redlease.AsyncOnce(ar, n, at_most=30.0, every=3600.0)
            return await job.begin()
        return await made[n][primitive][0]()

    with _BusyServer(server.port):
        seed = sum(map(ord, primitive))
        reached = await _cancelled_at_random(take, tries=1000, tasks=8, seed=seed)
    await asyncio.sleep(0.5)  # a late script still on its way lands
    kind = "lock" if primitive == "once" else made[names[0]][primitive][1]
    held = [n for n in names if redlease.read_info(r, n, kind=kind).held]
    assert held == [], f"left held after every task ended: {held}"
    ran = {run.token for run in reached} if primitive == "once" else set()
    for n in names:
        record = r.get(lock_key(n) + ":once")
        # a period is used up only by a run that reached its caller
        assert record is None or record.decode().split(":")[1] in ran, n
        if primitive == "election":
            assert r.get(lock_key(n) + ":elect") is None  # nobody leads


@pytest.mark.parametrize("granted", [True, False], ids=["handed-over", "still-waiting"])
def test_a_waiter_cancelled_as_asyncio_run_ends_leaves_nothing_behind(
    server: Any, r: Any, name: str, granted: bool
) -> None:
    """The waiter is cancelled and ``main`` returns at once: asyncio.run's shutdown then
    cancels every task, the waiter's clean-up (begun in a task of its own) among them.
    The clean-up runs again, to its end. (It was cut: with a grant handed over, the name
    stayed granted to nobody until its ttl, every time.)"""

    async def main() -> None:
        client = families.aclient(port=server.port)
        lock = redlease.AsyncLock(client, name, ttl=30.0)
        holder = await lock.acquire()
        waiter = asyncio.create_task(lock.acquire())
        for _ in range(2000):  # (until it is queued: the server says)
            if await client.llen(lock_key(name) + ":line"):
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)  # and settled in its wait (queued, it still had a reply to read)
        if granted:
            await holder.release()  # handed to the waiter queued at that moment
        waiter.cancel()  # then main returns, the waiter not awaited
        if not granted:
            await holder.release()
        await client.aclose()  # (redlease talks on connections of its own)

    for _ in range(5):
        asyncio.run(main())
        assert r.get(lock_key(name)) is None
        assert r.llen(lock_key(name) + ":line") == 0
