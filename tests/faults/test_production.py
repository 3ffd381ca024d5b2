"""Ordinary production conditions (issue 15), on real server processes and through the
public API only: idle timeouts, killed connections, restarts with AOF, fork, bounded
connection pools, connection churn from timed-out waits, a hung server, and no private
attributes of other libraries in ``src/``.

Every server this module breaks or configures specially is its own process, stopped (and
resumed first, if paused) whatever the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import sys
import threading
import time
import traceback
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import families
import redlease
from redlease.tools import servers
from redlease.tools.chaos.proxy import FaultProxy
from waiting_helpers import Waiters, in_thread, lock_key, queued, wait_until

IDLE_GAP = 2.5  # seconds without a command: longer than the servers' `timeout 1`
# auto_renew renews a third of the ttl after the last renewal: 2.5 s apart, so the renewer's
# own connection sits idle past the timeout between renewals; held over two renewals
RENEWED_TTL = 7.5
RENEWED_HOLD = 6.0


# -- servers and clients ----------------------------------------------------------------------


@contextlib.contextmanager
def _started(
    binary: servers.ServerBinary, count: int, **options: Any
) -> Iterator[list[servers.ServerProcess]]:
    """``count`` private servers; always stopped (a paused one is resumed by ``stop``)."""
    made: list[servers.ServerProcess] = []
    try:
        for _ in range(count):
            made.append(servers.ServerProcess(binary, **options).start())
        yield made
    finally:
        for proc in made:
            proc.stop()


@pytest.fixture
def idle_nodes(binary: servers.ServerBinary) -> Iterator[list[servers.ServerProcess]]:
    """Three servers that close a client connection after 1 s without a command."""
    with _started(binary, 3, extra_args=("--timeout", "1")) as made:
        yield made


@pytest.fixture
def own_nodes(binary: servers.ServerBinary) -> Iterator[list[servers.ServerProcess]]:
    """Three plain servers this test may break."""
    with _started(binary, 3) as made:
        yield made


@pytest.fixture
def own_server(own_nodes: list[servers.ServerProcess]) -> servers.ServerProcess:
    return own_nodes[0]


@pytest.fixture
def aof_nodes(binary: servers.ServerBinary) -> Iterator[list[servers.ServerProcess]]:
    """Three servers that persist every write (`appendonly yes`, `appendfsync always`), so a
    restart on the same port keeps the keys and their TTLs."""
    with _started(binary, 3, appendfsync_always=True) as made:
        yield made


@contextlib.contextmanager
def _clients(procs: Sequence[servers.ServerProcess], **options: Any) -> Iterator[list[redis.Redis]]:
    made = [families.client(port=p.port, **options) for p in procs]
    try:
        yield made
    finally:
        for client in made:
            client.close()


@contextlib.asynccontextmanager
async def _aclients(
    procs: Sequence[servers.ServerProcess], **options: Any
) -> AsyncIterator[list[aredis.Redis]]:
    made = [families.aclient(port=p.port, **options) for p in procs]
    try:
        yield made
    finally:
        for client in made:
            await client.aclose()


def _key(name: str) -> str:
    """The lock key (see ``redlease._rules.keys``): its value is the holder's token."""
    return lock_key(name)


def _holder(port: int, name: str) -> bytes | None:
    """The token that holds ``name`` on the server, read over a fresh connection."""
    with families.client(port=port) as fresh:
        value: bytes | None = fresh.get(_key(name))
        return value


def _pttl(port: int, name: str) -> int:
    with families.client(port=port) as fresh:
        return int(fresh.pttl(_key(name)))


def _third_party_gets_it(ports: Sequence[int], name: str) -> bool:
    """Whether a stranger (new clients, new lock object) takes ``name`` at once; if it
    does, it gives it straight back."""
    made = [families.client(port=port) for port in ports]
    try:
        lock: redlease.Lock | redlease.Redlock
        if len(made) == 1:
            lock = redlease.Lock(made[0], name, ttl=5.0)
        else:
            lock = redlease.Redlock(made, name, ttl=5.0)
        lease = lock.try_acquire()
        if lease is None:
            return False
        lease.release()
        return True
    finally:
        for client in made:
            client.close()


def _released_everywhere(ports: Sequence[int], name: str, within: float = 1.0) -> None:
    """A Redlock release returns once a majority said yes. The last node usually follows
    within a moment; one whose connection the server was closing just as the release
    was written (CLIENT KILL replies before it closes) keeps the key until its ttl, as
    any node that missed a release does: it must still carry one."""
    assert sum(_holder(port, name) is None for port in ports) > len(ports) // 2
    deadline = time.monotonic() + within
    while (held := [port for port in ports if _holder(port, name) is not None]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.02)
    for port in held:
        with families.client(port=port) as admin:
            assert 0 < admin.pttl(lock_key(name)) <= 10_000


def _kill_other_clients(port: int) -> int:
    """`CLIENT KILL` every connection on the server but the one doing the killing."""
    with families.client(port=port) as admin:
        own = int(admin.client_id())
        killed = 0
        for entry in admin.client_list():
            if int(entry["id"]) != own:
                killed += int(admin.client_kill_filter(_id=entry["id"]))
        return killed


def _connections_received(client: redis.Redis) -> int:
    return int(client.info("stats")["total_connections_received"])


# -- 1. an idle timeout on the server (`timeout 1`) ---------------------------------------------


def test_idle_timeout_lock(idle_nodes: list[servers.ServerProcess], name: str) -> None:
    with _clients(idle_nodes[:1]) as (client,):
        lock = redlease.Lock(client, name, ttl=5.0)
        lock.acquire(timeout=2.0).release()
        time.sleep(IDLE_GAP)  # the server closes our idle connections
        lock.acquire(timeout=2.0).release()
    assert _holder(idle_nodes[0].port, name) is None


async def test_idle_timeout_async_lock(idle_nodes: list[servers.ServerProcess], name: str) -> None:
    async with _aclients(idle_nodes[:1]) as (client,):
        lock = redlease.AsyncLock(client, name, ttl=5.0)
        await (await lock.acquire(timeout=2.0)).release()
        await asyncio.sleep(IDLE_GAP)
        await (await lock.acquire(timeout=2.0)).release()
    assert _holder(idle_nodes[0].port, name) is None


def test_idle_timeout_redlock(idle_nodes: list[servers.ServerProcess], name: str) -> None:
    with _clients(idle_nodes) as clients:
        lock = redlease.Redlock(clients, name, ttl=5.0)
        lock.acquire(timeout=2.0).release()
        time.sleep(IDLE_GAP)
        lock.acquire(timeout=2.0).release()
    _released_everywhere([p.port for p in idle_nodes], name)


async def test_idle_timeout_async_redlock(
    idle_nodes: list[servers.ServerProcess], name: str
) -> None:
    async with _aclients(idle_nodes) as clients:
        lock = redlease.AsyncRedlock(clients, name, ttl=5.0)
        await (await lock.acquire(timeout=2.0)).release()
        await asyncio.sleep(IDLE_GAP)
        await (await lock.acquire(timeout=2.0)).release()
    _released_everywhere([p.port for p in idle_nodes], name)


def test_idle_timeout_lease_held_across_the_gap(
    idle_nodes: list[servers.ServerProcess], name: str
) -> None:
    with _clients(idle_nodes[:1]) as (client,):
        lease = redlease.Lock(client, name, ttl=10.0).acquire(timeout=2.0)
        time.sleep(IDLE_GAP)
        lease.extend(10.0)
        lease.release()
    assert _holder(idle_nodes[0].port, name) is None


async def test_idle_timeout_async_lease_held_across_the_gap(
    idle_nodes: list[servers.ServerProcess], name: str
) -> None:
    async with _aclients(idle_nodes[:1]) as (client,):
        lease = await redlease.AsyncLock(client, name, ttl=10.0).acquire(timeout=2.0)
        await asyncio.sleep(IDLE_GAP)
        await lease.extend(10.0)
        await lease.release()
    assert _holder(idle_nodes[0].port, name) is None


@pytest.mark.slow
def test_idle_timeout_auto_renewed_lease_stays_held(
    idle_nodes: list[servers.ServerProcess], name: str
) -> None:
    """The application is idle; the renewer's own gaps between renewals may exceed the
    server's timeout: its connection is closed under it, and renewal must carry on."""
    lost: list[str] = []
    with _clients(idle_nodes[:1]) as (client,):
        lock = redlease.Lock(
            client, name, ttl=RENEWED_TTL, auto_renew=True, on_lost=lambda _: lost.append("x")
        )
        with lock as lease:
            time.sleep(RENEWED_HOLD)
            assert not lease.lost, "the renewer lost the lease"
            assert _holder(idle_nodes[0].port, name) == lease.token.encode()
        assert lost == []
    assert _holder(idle_nodes[0].port, name) is None


@pytest.mark.slow
async def test_idle_timeout_async_auto_renewed_lease_stays_held(
    idle_nodes: list[servers.ServerProcess], name: str
) -> None:
    lost: list[str] = []
    async with _aclients(idle_nodes[:1]) as (client,):
        lock = redlease.AsyncLock(
            client, name, ttl=RENEWED_TTL, auto_renew=True, on_lost=lambda _: lost.append("x")
        )
        async with lock as lease:
            await asyncio.sleep(RENEWED_HOLD)
            assert not lease.lost, "the renewer lost the lease"
            assert _holder(idle_nodes[0].port, name) == lease.token.encode()
        assert lost == []
    assert _holder(idle_nodes[0].port, name) is None


# -- 2. connections killed between acquire and release (`CLIENT KILL`) ------------------------


def test_client_kill_then_release_lock(own_server: servers.ServerProcess, name: str) -> None:
    port = own_server.port
    with _clients([own_server]) as (client,):
        lock = redlease.Lock(client, name, ttl=10.0)
        lease = lock.acquire(timeout=2.0)
        _kill_other_clients(port)
        lease.release()  # on a new connection: no BackendError, no LockLost
        assert _holder(port, name) is None
        assert _third_party_gets_it([port], name)
        _kill_other_clients(port)  # killed while idle: the next acquire is not bothered
        lock.acquire(timeout=2.0).release()


async def test_client_kill_then_release_async_lock(
    own_server: servers.ServerProcess, name: str
) -> None:
    port = own_server.port
    async with _aclients([own_server]) as (client,):
        lock = redlease.AsyncLock(client, name, ttl=10.0)
        lease = await lock.acquire(timeout=2.0)
        _kill_other_clients(port)
        await lease.release()
        assert _holder(port, name) is None
        assert _third_party_gets_it([port], name)
        _kill_other_clients(port)
        await (await lock.acquire(timeout=2.0)).release()


def test_client_kill_then_release_redlock(
    own_nodes: list[servers.ServerProcess], name: str
) -> None:
    ports = [p.port for p in own_nodes]
    with _clients(own_nodes) as clients:
        lock = redlease.Redlock(clients, name, ttl=10.0)
        lease = lock.acquire(timeout=2.0)
        for port in ports:
            _kill_other_clients(port)
        lease.release()
        _released_everywhere(ports, name)
        assert _third_party_gets_it(ports, name)
        for port in ports:
            _kill_other_clients(port)
        lock.acquire(timeout=2.0).release()


async def test_client_kill_then_release_async_redlock(
    own_nodes: list[servers.ServerProcess], name: str
) -> None:
    ports = [p.port for p in own_nodes]
    async with _aclients(own_nodes) as clients:
        lock = redlease.AsyncRedlock(clients, name, ttl=10.0)
        lease = await lock.acquire(timeout=2.0)
        for port in ports:
            _kill_other_clients(port)
        await lease.release()
        _released_everywhere(ports, name)
        assert _third_party_gets_it(ports, name)
        for port in ports:
            _kill_other_clients(port)
        await (await lock.acquire(timeout=2.0)).release()


# -- 3. a restart with AOF (the keys survive) ----------------------------------------------------


def test_restart_with_aof_while_idle_lock(
    aof_nodes: list[servers.ServerProcess], name: str
) -> None:
    proc = aof_nodes[0]
    with _clients([proc]) as (client,):
        lock = redlease.Lock(client, name, ttl=10.0)
        first = lock.acquire(timeout=2.0)
        first.release()
        proc.restart()
        second = lock.acquire(timeout=2.0)
        assert second.fence > first.fence  # the fencing counter survived too
        second.release()
    assert _holder(proc.port, name) is None


async def test_restart_with_aof_while_idle_async_lock(
    aof_nodes: list[servers.ServerProcess], name: str
) -> None:
    proc = aof_nodes[0]
    async with _aclients([proc]) as (client,):
        lock = redlease.AsyncLock(client, name, ttl=10.0)
        first = await lock.acquire(timeout=2.0)
        await first.release()
        proc.restart()
        second = await lock.acquire(timeout=2.0)
        assert second.fence > first.fence
        await second.release()
    assert _holder(proc.port, name) is None


def test_restart_with_aof_while_idle_redlock(
    aof_nodes: list[servers.ServerProcess], name: str
) -> None:
    with _clients(aof_nodes) as clients:
        lock = redlease.Redlock(clients, name, ttl=10.0)
        first = lock.acquire(timeout=2.0)
        first.release()
        for proc in aof_nodes:
            proc.restart()
        second = lock.acquire(timeout=2.0)
        assert second.fence > first.fence
        second.release()
    _released_everywhere([p.port for p in aof_nodes], name)


def test_a_redlock_wait_without_a_timeout_says_when_a_majority_is_unreachable(
    own_nodes: list[servers.ServerProcess], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """It waits on (the nodes may come back), logging a warning that names the nodes,
    where it waited in silence; contention alone says nothing."""
    caplog.set_level(logging.WARNING, logger="redlease")
    with _clients(own_nodes, socket_timeout=1.0) as clients:
        lock = redlease.Redlock(clients, name, ttl=10.0)
        busy = lock.acquire(timeout=2.0)
        thread, out = in_thread(lambda: lock.acquire().release())
        time.sleep(0.3)
        busy.release()
        thread.join(timeout=30)
        assert out == [None]
        assert not [r for r in caplog.records if "nodes answered" in r.getMessage()]
        for proc in own_nodes[1:]:
            proc.kill()
        thread, out = in_thread(lambda: lock.acquire().release())
        try:
            wait_until(lambda: any("nodes answered" in r.getMessage() for r in caplog.records), 30)
            said = [r.getMessage() for r in caplog.records if "nodes answered" in r.getMessage()]
            assert len(said) == 1  # (then at most every 30 s)
            assert "only 1 of 3 nodes answered, 2 needed" in said[0]
            assert f":{own_nodes[1].port}/0: the server cannot be reached" in said[0], said[0]
            assert thread.is_alive()  # it waits on
        finally:  # (the nodes back, the wait ends: a failure here must not hang the run)
            for proc in own_nodes[1:]:
                proc.restart()
        thread.join(timeout=60)
        assert out == [None]


async def test_restart_with_aof_while_idle_async_redlock(
    aof_nodes: list[servers.ServerProcess], name: str
) -> None:
    async with _aclients(aof_nodes) as clients:
        lock = redlease.AsyncRedlock(clients, name, ttl=10.0)
        first = await lock.acquire(timeout=2.0)
        await first.release()
        for proc in aof_nodes:
            proc.restart()
        second = await lock.acquire(timeout=2.0)
        assert second.fence > first.fence
        await second.release()
    _released_everywhere([p.port for p in aof_nodes], name)


def test_restart_with_aof_lease_held_across_it(
    aof_nodes: list[servers.ServerProcess], name: str
) -> None:
    proc = aof_nodes[0]
    with _clients([proc]) as (client,):
        lease = redlease.Lock(client, name, ttl=10.0).acquire(timeout=2.0)
        proc.restart()
        assert _holder(proc.port, name) == lease.token.encode()  # kept by the AOF
        lease.release()
    assert _holder(proc.port, name) is None


async def test_restart_with_aof_async_lease_held_across_it(
    aof_nodes: list[servers.ServerProcess], name: str
) -> None:
    proc = aof_nodes[0]
    async with _aclients([proc]) as (client,):
        lease = await redlease.AsyncLock(client, name, ttl=10.0).acquire(timeout=2.0)
        proc.restart()
        assert _holder(proc.port, name) == lease.token.encode()
        await lease.release()
    assert _holder(proc.port, name) is None


# -- 3b. a reply lost with its connection: sent again only where that is safe ------------------


def _reset_soon(proxy: FaultProxy, after: float = 0.3) -> threading.Timer:
    """Reset every connection through ``proxy`` in a moment (a reply dropped meanwhile is
    then lost with its connection)."""
    timer = threading.Timer(after, proxy.reset_connections)
    timer.start()
    return timer


def test_a_release_whose_reply_is_lost_is_sent_again_and_says_released(
    own_server: servers.ServerProcess, name: str
) -> None:
    """The release was applied, its reply lost with the connection: the release is sent
    again on a new one, finds the mark its first run left, and reports a clean release
    (not LockLost, not BackendError)."""
    with FaultProxy("127.0.0.1", own_server.port).start() as proxy:
        client = families.client(port=proxy.port)
        try:
            lease = redlease.Lock(client, name, ttl=10.0).acquire(timeout=2.0)
            proxy.set_mode("drop_next_reply")
            timer = _reset_soon(proxy)
            lease.release()
            timer.join()
            assert lease.released
            assert _holder(own_server.port, name) is None
        finally:
            client.close()


async def test_an_acquire_whose_reply_is_lost_is_sent_again_and_finds_its_grant(
    own_server: servers.ServerProcess, name: str
) -> None:
    """The acquire was applied, its reply lost with the connection: sent again with the
    same token, it finds its own grant: one fence taken, the lease is ours."""
    with FaultProxy("127.0.0.1", own_server.port).start() as proxy:
        client = families.aclient(port=proxy.port)
        try:
            lock = redlease.AsyncLock(client, name, ttl=10.0)
            first = await lock.acquire(timeout=2.0)  # scripts loaded
            await first.release()
            proxy.set_mode("drop_next_reply")
            timer = _reset_soon(proxy)
            lease = await lock.acquire(timeout=5.0)
            timer.join()
            assert _holder(own_server.port, name) == lease.token.encode()
            with families.client(port=own_server.port) as admin:
                # the retried acquire found its own grant: no second fence taken
                assert int(admin.get(_key(name) + ":fence") or 0) == lease.fence
            assert lease.fence > first.fence
            await lease.release()
        finally:
            await client.aclose()


def test_a_queueing_acquire_whose_reply_is_lost_is_sent_again_and_queued_once(
    own_server: servers.ServerProcess, name: str
) -> None:
    """A try that queued, its reply lost with the connection: sent again, it asks for its
    place to be searched for, and keeps it; queued twice, the second place would be
    granted after the waiter was done with the lock, to nobody (held until its ttl)."""
    admin = families.client(port=own_server.port)
    with FaultProxy("127.0.0.1", own_server.port).start() as proxy:
        client = families.client(port=proxy.port)
        lock = redlease.Lock(client, name, ttl=10.0)
        holder = redlease.Lock(admin, name, ttl=10.0).acquire()
        got: list[Any] = []

        def wait_and_release() -> None:
            lease = lock.acquire(timeout=60)
            got.append(lease.fence)
            lease.release()

        try:
            first = threading.Thread(target=wait_and_release)
            first.start()  # so that the second's first try queues: the lock is waited for
            wait_until(lambda: queued(admin, name) == 1, timeout=30)
            proxy.set_mode("drop_next_reply")
            timer = _reset_soon(proxy)
            second = threading.Thread(target=wait_and_release)
            second.start()
            timer.join()
            wait_until(lambda: queued(admin, name) >= 2, timeout=30)
            time.sleep(0.5)  # every try the reset set off has landed
            tokens = [w.token for w in redlease.read_info(admin, name).waiters]
            assert len(tokens) == len(set(tokens)) == 2, tokens
            holder.release()
            first.join(60)
            second.join(60)
            assert len(got) == 2
            # nothing was granted after both were done
            time.sleep(0.3)
            assert _holder(own_server.port, name) is None
            assert queued(admin, name) == 0
        finally:
            client.close()
            admin.close()


# -- 4. fork: a child can neither release nor extend its parent's leases -----------------------

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _fork() -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a threaded process
        return os.fork()


def _wait_child(pid: int, deadline: float = 20.0) -> int:
    """The child's exit code; a child still running after ``deadline`` s is killed."""
    ends = time.monotonic() + deadline
    while time.monotonic() < ends:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"the child did not end within {deadline} s")


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode()


def _attempt(action: Callable[[], object]) -> str:
    """What one lease call did: "LockLost", "returned", or the unexpected exception."""
    try:
        action()
    except redlease.LockLost:
        return "LockLost"
    except BaseException as exc:  # reported to the parent, which fails the test
        return f"raised {exc!r}"
    return "returned"


def _fork_inside_with(
    lock: redlease.Lock,
    in_child: Callable[[redlease.Lease], str | None],
    in_parent: Callable[[redlease.Lease, str], None],
) -> None:
    """Hold ``lock`` in a ``with`` block and fork inside it. The child runs
    ``in_child(lease)``: a string it returns is reported to the parent and the child ends
    at once (``os._exit``, no clean-up); ``None`` (or an exception, ``SystemExit``
    included) makes the child leave the ``with`` block, running its exit, and report how
    it left. The parent waits for the child, then runs ``in_parent(lease, report)`` while
    still inside the block, and leaves the block (its release must succeed)."""
    read_end, write_end = os.pipe()
    pid = -1
    report = "left the with block normally"
    try:
        with lock as lease:
            pid = _fork()
            if pid == 0:
                os.close(read_end)
                said = in_child(lease)
                if said is not None:  # end here: the with exit must not run
                    _report_and_exit(write_end, said)
            else:
                os.close(write_end)
                said_by_child = _read_all(read_end)
                code = _wait_child(pid)
                assert code == 0, f"the child exited with {code}: {said_by_child}"
                in_parent(lease, said_by_child)
    except BaseException as exc:
        if pid != 0:
            raise
        report = f"left the with block by {exc!r}"
    finally:
        if pid == 0:
            _report_and_exit(write_end, report)


def _report_and_exit(write_end: int, report: str) -> None:
    """In a forked child: send ``report`` to the parent and end at once (no clean-up)."""
    try:
        os.write(write_end, report.encode())
        os.close(write_end)
    finally:
        os._exit(0)


def _still_the_parents(port: int, name: str, lease: redlease.Lease, child: str) -> None:
    """The parent holds the lock on the server, untouched by the child (which said
    ``child`` about what it did)."""
    assert _holder(port, name) == lease.token.encode(), (
        f"the child released the parent's lock (the child: {child})"
    )
    assert not _third_party_gets_it([port], name), "a third party took the parent's lock"
    assert _pttl(port, name) <= 10_000, f"the child extended the parent's lock (the child: {child})"
    assert not lease.lost
    lease.check()


@needs_fork
@pytest.mark.parametrize("auto_renew", [False, True], ids=["plain", "auto_renew"])
def test_fork_child_exiting_inside_with_leaves_the_parents_lock(
    server: servers.ServerProcess, name: str, auto_renew: bool
) -> None:
    with _clients([server]) as (client,):
        lock = redlease.Lock(client, name, ttl=10.0, auto_renew=auto_renew)

        def in_child(lease: redlease.Lease) -> str | None:
            sys.exit(0)  # inside the parent's `with lock:`: the child runs its exit

        def in_parent(lease: redlease.Lease, report: str) -> None:
            assert report.startswith("left the with block"), report
            _still_the_parents(server.port, name, lease, report)

        _fork_inside_with(lock, in_child, in_parent)
    assert _holder(server.port, name) is None  # the parent's own exit released it


@needs_fork
@pytest.mark.parametrize("auto_renew", [False, True], ids=["plain", "auto_renew"])
@pytest.mark.parametrize("call", ["release", "extend"])
def test_fork_child_cannot_release_or_extend_the_parents_lease(
    server: servers.ServerProcess, name: str, auto_renew: bool, call: str
) -> None:
    with _clients([server]) as (client,):
        lock = redlease.Lock(client, name, ttl=10.0, auto_renew=auto_renew)

        def in_child(lease: redlease.Lease) -> str | None:
            if call == "release":
                return _attempt(lease.release)
            return _attempt(lambda: lease.extend(60.0))

        def in_parent(lease: redlease.Lease, report: str) -> None:
            # LockLost, or a no-op that sent nothing (the server says which)
            assert report in ("LockLost", "returned"), f"the child's {call}(): {report}"
            _still_the_parents(server.port, name, lease, report)

        _fork_inside_with(lock, in_child, in_parent)
    assert _holder(server.port, name) is None


def _mp_child(lease: redlease.Lease, to_parent: Connection) -> None:
    """A multiprocessing child (fork start method): tries the parent's lease."""
    to_parent.send([_attempt(lambda: lease.extend(60.0)), _attempt(lease.release)])
    to_parent.close()


@needs_fork
@pytest.mark.parametrize("auto_renew", [False, True], ids=["plain", "auto_renew"])
def test_multiprocessing_fork_child_cannot_release_or_extend_the_parents_lease(
    server: servers.ServerProcess, name: str, auto_renew: bool
) -> None:
    ctx = multiprocessing.get_context("fork")
    with _clients([server]) as (client,):
        lock = redlease.Lock(client, name, ttl=10.0, auto_renew=auto_renew)
        with lock as lease:
            receive, send = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_mp_child, args=(lease, send))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # fork of a threaded process
                child.start()
            send.close()
            try:
                assert receive.poll(20), "the child reported nothing"
                extend, release = receive.recv()
            finally:
                receive.close()
                child.join(20)
                if child.exitcode is None:
                    child.kill()
                    child.join()
            assert child.exitcode == 0
            assert extend in ("LockLost", "returned"), f"the child's extend(): {extend}"
            assert release in ("LockLost", "returned"), f"the child's release(): {release}"
            _still_the_parents(server.port, name, lease, f"extend: {extend}, release: {release}")
        child.close()
    assert _holder(server.port, name) is None


# -- 5. the application's bounded pool is the application's ------------------------------------

POOL_SLOTS = 10  # the application's pool (asyncio)
SYNC_POOL_SLOTS = 5  # the same, sync
APP_CONCURRENCY = 3  # commands the application has in flight at once


async def _slots_free(client: aredis.Redis, name: str, count: int) -> None:
    """``count`` commands that each keep a connection for 0.2 s, all at once."""
    await asyncio.wait_for(
        asyncio.gather(*(client.blpop([f"{name}:nothing"], timeout=0.2) for _ in range(count))),
        timeout=10,
    )


def _sync_slots_free(client: redis.Redis, name: str, count: int) -> list[str]:
    """The same from ``count`` threads; what failed."""
    errors: list[str] = []

    def blocking_command() -> None:
        try:
            client.blpop([f"{name}:nothing"], timeout=0.2)
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=blocking_command) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return errors


async def test_async_waiters_leave_the_applications_pool_alone(
    server: servers.ServerProcess, name: str
) -> None:
    """30 tasks wait on a lock through a client whose pool has 10 slots, while the
    application runs its own commands through it: the application never fails, the slots
    it is not using can be taken all at once while the waiters wait, every waiter gets the
    lock in turn, and all 10 slots are free afterwards."""
    client = families.aclient(port=server.port, max_connections=POOL_SLOTS)
    lock = redlease.AsyncLock(client, name, ttl=10.0)
    fences: list[int] = []
    app_errors: list[str] = []
    app_rounds = 0
    waiting_done = asyncio.Event()

    async def waiter() -> None:
        lease = await lock.acquire(timeout=10.0)
        fences.append(lease.fence)
        await asyncio.sleep(0.002)
        await lease.release()

    async def application() -> None:
        nonlocal app_rounds
        while not waiting_done.is_set():
            try:  # a few commands at once, as an application's tasks would send them
                await asyncio.gather(
                    *(client.set(f"{name}:app:{i}", app_rounds) for i in range(APP_CONCURRENCY))
                )
                got = await asyncio.gather(
                    *(client.get(f"{name}:app:{i}") for i in range(APP_CONCURRENCY))
                )
                assert got == [str(app_rounds).encode()] * APP_CONCURRENCY
            except Exception as exc:  # collected: the test names each one
                app_errors.append(repr(exc))
            app_rounds += 1
            await asyncio.sleep(0.005)

    tasks: list[asyncio.Task[None]] = []
    try:
        holder = await lock.acquire(timeout=2.0)
        tasks = [asyncio.create_task(waiter()) for _ in range(30)]
        app = asyncio.create_task(application())
        tasks.append(app)
        await asyncio.sleep(0.5)  # the waiters are blocked on the server now
        # the slots the application is not using are free to take, all at once
        await _slots_free(client, name, POOL_SLOTS - APP_CONCURRENCY)
        await asyncio.sleep(0.3)
        await holder.release()
        waited = await asyncio.wait_for(
            asyncio.gather(*tasks[:-1], return_exceptions=True), timeout=30
        )
        waiting_done.set()
        await app
        assert app_errors == [], f"{len(app_errors)} of {app_rounds} application rounds failed"
        failed = [repr(w) for w in waited if isinstance(w, BaseException)]
        assert failed == [], f"{len(failed)} of 30 waiters failed: {failed[:3]}"
        assert len(fences) == 30
        assert fences == sorted(set(fences)), "fences must increase hold after hold"
        await _slots_free(client, name, POOL_SLOTS)  # and afterwards, all of them
    finally:
        waiting_done.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.aclose()


def test_sync_waiters_leave_the_applications_pool_alone(
    server: servers.ServerProcess, name: str
) -> None:
    """The same with 15 waiting threads and a sync pool of 5 slots."""
    pool = families.pool(port=server.port, max_connections=SYNC_POOL_SLOTS)
    client = families.client(connection_pool=pool)
    lock = redlease.Lock(client, name, ttl=10.0)
    fences: list[int] = []
    failures: list[str] = []
    app_errors: list[str] = []
    app_rounds = 0
    waiting_done = threading.Event()

    def waiter() -> None:
        try:
            lease = lock.acquire(timeout=10.0)
            fences.append(lease.fence)
            time.sleep(0.002)
            lease.release()
        except Exception as exc:
            failures.append(repr(exc))

    def application() -> None:
        nonlocal app_rounds
        while not waiting_done.is_set():
            try:
                client.set(f"{name}:app", app_rounds)
                assert client.get(f"{name}:app") == str(app_rounds).encode()
            except Exception as exc:
                app_errors.append(repr(exc))
            app_rounds += 1
            time.sleep(0.005)

    threads = [threading.Thread(target=waiter) for _ in range(15)]
    app = threading.Thread(target=application)
    try:
        holder = lock.acquire(timeout=2.0)
        for thread in [*threads, app]:
            thread.start()
        time.sleep(0.5)
        taken = _sync_slots_free(client, name, SYNC_POOL_SLOTS - 1)  # the app has one
        assert taken == [], f"the waiters took the application's slots: {taken[:2]}"
        time.sleep(0.3)
        holder.release()
        for thread in threads:
            thread.join(30)
        assert not any(t.is_alive() for t in threads), "waiters still waiting after 30 s"
        waiting_done.set()
        app.join(10)
        assert app_errors == [], f"{len(app_errors)} of {app_rounds} application rounds failed"
        assert failures == [], f"{len(failures)} of 15 waiters failed: {failures[:3]}"
        assert len(fences) == 15
        taken = _sync_slots_free(client, name, SYNC_POOL_SLOTS)
        assert taken == [], f"the pool's slots are not all free afterwards: {taken[:2]}"
    finally:
        waiting_done.set()
        for thread in [*threads, app]:
            if thread.ident is not None:  # started
                thread.join(30)
        client.close()
        pool.disconnect()


# -- 6. timed-out waits keep their connections -------------------------------------------------

TIMED_OUT_WAITS = 200
NEW_CONNECTIONS_ALLOWED = 5


def test_timed_out_acquires_reuse_their_connections(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    holder = redlease.Lock(r, name, ttl=60.0).acquire()
    with _clients([server]) as (client,):
        lock = redlease.Lock(client, name, ttl=60.0)
        with pytest.raises(redlease.AcquireTimeout):
            lock.acquire(timeout=0.01)  # whatever connections a first wait needs
        before = _connections_received(r)
        for _ in range(TIMED_OUT_WAITS):
            with pytest.raises(redlease.AcquireTimeout):
                lock.acquire(timeout=0.01)
        opened = _connections_received(r) - before
    holder.release()
    assert opened <= NEW_CONNECTIONS_ALLOWED, (
        f"{TIMED_OUT_WAITS} timed-out acquires opened {opened} new connections"
    )


async def test_async_timed_out_acquires_reuse_their_connections(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    holder = redlease.Lock(r, name, ttl=60.0).acquire()
    async with _aclients([server]) as (client,):
        lock = redlease.AsyncLock(client, name, ttl=60.0)
        with pytest.raises(redlease.AcquireTimeout):
            await lock.acquire(timeout=0.01)
        before = _connections_received(r)
        for _ in range(TIMED_OUT_WAITS):
            with pytest.raises(redlease.AcquireTimeout):
                await lock.acquire(timeout=0.01)
        opened = _connections_received(r) - before
    holder.release()
    assert opened <= NEW_CONNECTIONS_ALLOWED, (
        f"{TIMED_OUT_WAITS} timed-out acquires opened {opened} new connections"
    )


# -- 7. a hung server (SIGSTOP): bounded by socket_timeout and the wait's timeout ---------------

SOCKET_TIMEOUT = 0.5
TRY_BOUND = 2.0  # try_acquire(): one attempt, bounded by the client's socket_timeout
ACQUIRE_TIMEOUT = 0.5
ACQUIRE_BOUND = 2.5  # acquire(timeout=0.5): its own timeout, plus slack

# redis-py's default `retry` (redis-py 8: 10 retries with backoff) also retries timeouts:
# its own GET on a stopped server takes ~9 s with socket_timeout=0.5. try_acquire() is
# pinned both with the client's default retry and with retries turned off.
RETRIES: dict[str, dict[str, Any]] = {
    "default_retry": {},
    "no_retry": {"retry": families.retry(0)},
}
ARETRIES: dict[str, dict[str, Any]] = {
    "default_retry": {},
    "no_retry": {"retry": families.aretry(0)},
}


def _bounded(action: Callable[[], object]) -> tuple[float, str]:
    """How long ``action`` took and how it ended (it may return, or raise BackendError)."""
    started = time.monotonic()
    try:
        action()
    except redlease.BackendError as exc:
        return time.monotonic() - started, f"BackendError: {exc}"
    except redlease.AcquireTimeout:
        return time.monotonic() - started, "AcquireTimeout"
    return time.monotonic() - started, "returned"


async def _abounded(action: Callable[[], Any]) -> tuple[float, str]:
    started = time.monotonic()
    try:
        await asyncio.wait_for(action(), timeout=60)
    except redlease.BackendError as exc:
        return time.monotonic() - started, f"BackendError: {exc}"
    except redlease.AcquireTimeout:
        return time.monotonic() - started, "AcquireTimeout"
    return time.monotonic() - started, "returned"


def _on_stopped_server(
    proc: servers.ServerProcess, lock: redlease.Lock, call: Callable[[], object]
) -> tuple[float, str]:
    lock.acquire(timeout=2.0).release()  # connected, scripts loaded
    proc.pause()
    try:
        return _bounded(call)
    finally:
        proc.resume()


async def _aon_stopped_server(
    proc: servers.ServerProcess, lock: redlease.AsyncLock, call: Callable[[], Any]
) -> tuple[float, str]:
    await (await lock.acquire(timeout=2.0)).release()
    proc.pause()
    try:
        return await _abounded(call)
    finally:
        proc.resume()


@pytest.mark.parametrize("retry", list(RETRIES))
def test_hung_server_try_acquire_is_bounded_by_socket_timeout(
    own_server: servers.ServerProcess, name: str, retry: str
) -> None:
    with _clients([own_server], socket_timeout=SOCKET_TIMEOUT, **RETRIES[retry]) as (client,):
        lock = redlease.Lock(client, name, ttl=5.0)
        took, how = _on_stopped_server(own_server, lock, lock.try_acquire)
    assert took < TRY_BOUND, f"try_acquire() on a stopped server took {took:.2f} s ({how})"


def test_hung_server_acquire_is_bounded_by_its_timeout(
    own_server: servers.ServerProcess, name: str
) -> None:
    with _clients([own_server], socket_timeout=SOCKET_TIMEOUT) as (client,):
        lock = redlease.Lock(client, name, ttl=5.0)
        took, how = _on_stopped_server(
            own_server, lock, lambda: lock.acquire(timeout=ACQUIRE_TIMEOUT)
        )
    assert took < ACQUIRE_BOUND, (
        f"acquire(timeout=0.5) on a stopped server took {took:.2f} s ({how})"
    )


@pytest.mark.parametrize("retry", list(RETRIES))
async def test_async_hung_server_try_acquire_is_bounded_by_socket_timeout(
    own_server: servers.ServerProcess, name: str, retry: str
) -> None:
    async with _aclients([own_server], socket_timeout=SOCKET_TIMEOUT, **RETRIES[retry]) as (
        client,
    ):
        lock = redlease.AsyncLock(client, name, ttl=5.0)
        took, how = await _aon_stopped_server(own_server, lock, lock.try_acquire)
    assert took < TRY_BOUND, f"try_acquire() on a stopped server took {took:.2f} s ({how})"


async def test_async_hung_server_acquire_is_bounded_by_its_timeout(
    own_server: servers.ServerProcess, name: str
) -> None:
    async with _aclients([own_server], socket_timeout=SOCKET_TIMEOUT) as (client,):
        lock = redlease.AsyncLock(client, name, ttl=5.0)
        took, how = await _aon_stopped_server(
            own_server, lock, lambda: lock.acquire(timeout=ACQUIRE_TIMEOUT)
        )
    assert took < ACQUIRE_BOUND, (
        f"acquire(timeout=0.5) on a stopped server took {took:.2f} s ({how})"
    )


# -- 7. waiting through the hub (one shared wait connection) under the same conditions ---------


def _hub_waiters(client: Any, name: str, count: int) -> Waiters:
    """``count`` threads waiting for ``name`` through ``client``'s hub, once each."""
    return Waiters(redlease.Lock(client, name, ttl=30.0), count, timeout=60.0)


def _queued(r: Any, name: str, count: int) -> None:
    wait_until(lambda: queued(r, name) >= count, timeout=30)


def _subscribed(r: Any) -> int:
    return sum(1 for c in r.client_list() if c.get("sub") not in (None, "0", 0))


def test_hub_waiters_outlast_a_server_that_closes_idle_clients(
    idle_nodes: list[servers.ServerProcess], name: str
) -> None:
    server = idle_nodes[0]
    r = families.client(port=server.port)
    holder = redlease.Lock(r, name, ttl=30.0).acquire()
    waiters = _hub_waiters(families.client(port=server.port), name, 5)
    _queued(r, name, 5)
    time.sleep(2.5)  # idle past the server's timeout (1 s)
    assert _subscribed(r) == 1  # the hub was not closed as idle (pub/sub clients are not)
    holder.release()
    waiters.join()


@pytest.mark.parametrize("keep_data", [False, True])
def test_hub_waiters_outlast_a_restart(
    own_server: servers.ServerProcess,
    aof_nodes: list[servers.ServerProcess],
    name: str,
    keep_data: bool,
) -> None:
    server = aof_nodes[0] if keep_data else own_server
    r = families.client(port=server.port)
    holder = redlease.Lock(r, name, ttl=3.0).acquire()
    waiters = _hub_waiters(families.client(port=server.port), name, 5)
    _queued(r, name, 5)
    server.restart()  # the hub's connection is gone: every waiter looks at the lock again
    with contextlib.suppress(redlease.LockLost, redlease.BackendError):
        holder.release()  # (its lease went with the data, or the connection)
    waiters.join()  # with the data: after the holder's 3 s, or its release


@pytest.mark.parametrize("keep_data", [False, True])
def test_waiters_without_a_deadline_outlast_a_restart_that_takes_a_moment(
    own_server: servers.ServerProcess,
    aof_nodes: list[servers.ServerProcess],
    name: str,
    keep_data: bool,
) -> None:
    """With no deadline, the client's retries decide, spread over the reply bound: the
    hub's new connection (SUBSCRIBE) as much as the acquire's call. (Its one try failed on
    the closed port, and a waiter raised after the server was back.)"""
    server = aof_nodes[0] if keep_data else own_server
    r = families.client(port=server.port)
    holder = redlease.Lock(r, name, ttl=3.0).acquire()
    waiting = families.client(port=server.port, retry=families.retry(5))
    waiters = Waiters(redlease.Lock(waiting, name, ttl=10.0), 3, None)
    _queued(r, name, 3)
    server.restart(down=1.0)
    with contextlib.suppress(redlease.LockLost, redlease.BackendError):
        holder.release()
    waiters.join()


async def test_async_waiters_without_a_deadline_outlast_a_restart_that_takes_a_moment(
    own_server: servers.ServerProcess, name: str
) -> None:
    r = families.aclient(port=own_server.port)
    holder = await redlease.AsyncLock(r, name, ttl=30.0).acquire()
    waiting = families.aclient(port=own_server.port, retry=families.aretry(5))
    lock = redlease.AsyncLock(waiting, name, ttl=10.0)

    async def wait() -> None:
        async with lock:
            pass

    waiters = [asyncio.create_task(wait()) for _ in range(3)]
    await asyncio.to_thread(_queued, families.client(port=own_server.port), name, 3)
    await asyncio.to_thread(own_server.restart, down=1.0)  # (the holder's lease goes with it)
    await asyncio.wait_for(asyncio.gather(*waiters), 60)
    with contextlib.suppress(redlease.LockLost, redlease.BackendError):
        await holder.release()


def test_hub_waiters_over_a_slow_link(own_server: servers.ServerProcess, name: str) -> None:
    r = families.client(port=own_server.port)
    with FaultProxy("127.0.0.1", own_server.port).start() as proxy:
        proxy.set_mode("delay", delay_ms=50)
        holder = redlease.Lock(r, name, ttl=30.0).acquire()
        waiters = _hub_waiters(families.client(port=proxy.port, socket_timeout=5), name, 5)
        _queued(r, name, 5)
        holder.release()
        waiters.join()


@needs_fork
def test_a_forked_child_waits_through_a_hub_of_its_own(r: redis.Redis, name: str) -> None:
    lock = redlease.Lock(r, name, ttl=30.0)
    warm = _hub_waiters(r, name, 1)  # the parent's hub exists and listens on this lock
    warm.join()
    holder = lock.acquire()
    pid = _fork()
    if pid == 0:  # the child waits through a hub of its own (its parent's is not its)
        code = 1
        try:
            with lock.acquire(timeout=20):
                code = 0
        except BaseException:
            traceback.print_exc()  # (seen in the test's report: os._exit ends it unsaid)
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while int(r.llen(lock_key(name) + ":line")) < 1:
        ended, status = os.waitpid(pid, os.WNOHANG)
        assert not ended, f"the child ended before it queued: {os.waitstatus_to_exitcode(status)}"
        assert time.monotonic() < deadline, "the child did not queue"
        time.sleep(0.01)
    holder.release()
    assert _wait_child(pid) == 0
