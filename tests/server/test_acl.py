"""Least privilege and server checks, on real servers: a user with exactly the ACL rule
redlease documents can do everything; one without a part is told which, or goes without
what the part is for; a replica and a server that wants a password are named."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import families
import redlease
from redlease._rules.acl import PARTS, acl_rule, script_commands
from redlease._rules.keys import LockKeys
from redlease.tools import servers
from waiting_helpers import lock_key, wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs" / "least-privilege.md"
USER, PASSWORD = "locker", "locker-pw"
RULE = acl_rule()


def _grant(port: int, rule: str) -> None:
    """Make USER on the server at ``port`` hold exactly ``rule``."""
    admin: Any = families.client(port=port)
    admin.execute_command("ACL", "SETUSER", USER, "reset", "on", f">{PASSWORD}", *rule.split())
    admin.close()


def _without(*parts: str) -> str:
    return " ".join(p for p in RULE.split() if p not in parts)


def _user(port: int) -> Any:
    return families.client(port=port, username=USER, password=PASSWORD)


def _auser(port: int) -> Any:
    return families.aclient(port=port, username=USER, password=PASSWORD)


@pytest.fixture
def acl_servers(binary: servers.ServerBinary) -> Iterator[list[servers.ServerProcess]]:
    """Three servers of the kind, persistent (a Redlock over them has nothing to warn
    about), each with USER holding exactly the rule."""
    started: list[servers.ServerProcess] = []
    try:
        for _ in range(3):
            started.append(servers.ServerProcess(binary, appendfsync_always=True).start())
            _grant(started[-1].port, RULE)
        yield started
    finally:
        for server in started:
            server.stop()


def _hub_listens(port: int) -> bool:
    admin: Any = families.client(port=port)
    try:
        return bool(admin.execute_command("PUBSUB", "CHANNELS", "redlease:*"))
    finally:
        admin.close()


# -- the rule itself --------------------------------------------------------------------


def test_the_rule_grants_every_command_the_scripts_call() -> None:
    granted = {p[1:] for p in RULE.split() if p.startswith("+")}
    assert script_commands() - granted == set()
    assert {"set", "time", "pubsub|numsub", "spublish"} <= script_commands()


def test_the_docs_show_the_rule() -> None:
    text = DOCS.read_text()
    assert RULE in text  # the whole rule, as acl_rule() writes it
    for part in PARTS:  # and each part, explained
        shown = " ".join(g.format(prefix="redlease:") for g in part.grants)
        assert f"`{shown}`" in text, shown


def test_a_prefix_is_a_literal_in_the_rule() -> None:
    assert acl_rule("app:").split()[0] == "~app:*"
    assert acl_rule("a*b:").split()[0] == r"~a\*b:*"


# -- a user with exactly the rule -----------------------------------------------------------


def test_the_rule_is_enough_for_everything(acl_servers: list[servers.ServerProcess]) -> None:
    port = acl_servers[0].port
    client = _user(port)
    admin: Any = families.client(port=port)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about either
        lock = redlease.Lock(client, "orders", ttl=5.0)
        lease = lock.acquire(timeout=5)
        lease.extend(5.0)

        def release_once_rung_through_the_hub() -> None:
            wait_until(lambda: _hub_listens(port), timeout=30)
            lease.release()

        releaser = threading.Thread(target=release_once_rung_through_the_hub)
        releaser.start()
        lock.acquire(timeout=60).release()  # woken through the hub: channel rights work
        releaser.join()

        # (a ttl of 2 s, as the asyncio test's: room for a loaded machine)
        renewed = redlease.Lock(client, "renewed", ttl=2.0, auto_renew=True).acquire(timeout=5)
        admin.script_flush()  # the renewer loads the scripts again, without SCRIPT LOAD
        time.sleep(4.5)
        renewed.check()
        renewed.release()

        semaphore = redlease.Semaphore(client, "pool", limit=2, ttl=5.0)
        permits = [semaphore.acquire(timeout=5) for _ in range(2)]
        threading.Timer(0.2, permits[0].release).start()
        semaphore.acquire(timeout=60).release()
        permits[1].release()

        reader = redlease.ReadWriteLock(client, "catalog", ttl=5.0).read.acquire(timeout=5)
        threading.Timer(0.2, reader.release).start()
        redlease.ReadWriteLock(client, "catalog", ttl=5.0).write.acquire(timeout=60).release()

        redlease.MultiLock(client, ["a", "b"], ttl=5.0).acquire(timeout=5).release()

        seen: list[Any] = []
        done = threading.Event()

        def observe() -> None:
            observer = redlease.Election(_user(port), "leader", ttl=5.0, identity="watcher")
            with observer.observe() as changes:
                for leader in changes:
                    seen.append(leader)
                    if leader is not None:
                        done.set()
                        return

        watcher = threading.Thread(target=observe, daemon=True)
        watcher.start()
        election = redlease.Election(client, "leader", ttl=5.0, identity="host-a")
        election.campaign(timeout=10)
        assert done.wait(60), seen
        assert election.leader() is not None
        election.resign()
        watcher.join(30)

        nodes = [_user(s.port) for s in acl_servers]
        redlock = redlease.Redlock(nodes, "spread", ttl=2.0, auto_renew=True)
        held = redlock.acquire(timeout=10)
        time.sleep(0.5)
        held.check()
        held.release()
    admin.close()
    client.close()


async def test_the_rule_is_enough_for_asyncio(acl_servers: list[servers.ServerProcess]) -> None:
    port = acl_servers[0].port
    client = _auser(port)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lock = redlease.AsyncLock(client, "orders", ttl=5.0)
        lease = await lock.acquire(timeout=5)

        async def release_once_rung_through_the_hub() -> None:
            for _ in range(3000):
                if await asyncio.to_thread(_hub_listens, port):
                    break
                await asyncio.sleep(0.01)
            await lease.release()

        releasing = asyncio.ensure_future(release_once_rung_through_the_hub())
        await (await lock.acquire(timeout=60)).release()
        await releasing

        # (a ttl of 2 s: renewals on a loaded 2-core machine have a second to land, not
        # a third of one; 1 s lost the lease once in a run beside other heavy work)
        renewed = await redlease.AsyncLock(client, "renewed", ttl=2.0, auto_renew=True).acquire(
            timeout=5
        )
        admin = families.client(port=port)
        admin.script_flush()
        admin.close()
        await asyncio.sleep(4.5)  # (past its ttl twice over: it was renewed, scripts reloaded)
        renewed.check()
        await renewed.release()

        semaphore = redlease.AsyncSemaphore(client, "pool", limit=1, ttl=5.0)
        permit = await semaphore.acquire(timeout=5)
        asyncio.get_running_loop().call_later(0.2, lambda: asyncio.ensure_future(permit.release()))
        await (await semaphore.acquire(timeout=60)).release()

        election = redlease.AsyncElection(client, "leader", ttl=5.0, identity="host-a")
        await election.campaign(timeout=10)
        assert await election.leader() is not None
        await election.resign()

        nodes = [_auser(s.port) for s in acl_servers]
        held = await redlease.AsyncRedlock(nodes, "spread", ttl=2.0).acquire(timeout=10)
        await held.release()
        for node in nodes:
            await node.aclose()
    await client.aclose()


def test_replicas_needs_wait_and_works_with_it(
    master_and_replica: tuple[servers.ServerProcess, servers.ServerProcess],
) -> None:
    master, _ = master_and_replica
    _grant(master.port, RULE)
    client = _user(master.port)
    lock = redlease.Lock(client, "replicated", ttl=5.0, replicas=1, replica_timeout=2.0)
    lease = lock.acquire(timeout=10)
    threading.Timer(0.2, lease.release).start()
    again = lock.acquire(timeout=60)  # waits on a bell (BLPOP): replicas= has no hub
    again.extend(5.0)
    again.release()

    _grant(master.port, _without("+wait"))
    with pytest.raises(redlease.BackendError, match=r"may not run WAIT: add \+wait"):
        lock.acquire(timeout=10)
    client.close()


# -- without a part ----------------------------------------------------------------------


@pytest.fixture
def one_server(binary: servers.ServerBinary) -> Iterator[servers.ServerProcess]:
    with servers.ServerProcess(binary) as server:
        yield server


# Without functions (or on Redis 6.2), a fresh server is sent EVAL
NO_FUNCTIONS = ("+fcall", "+function|load")


def test_without_eval_the_error_says_which_permission(one_server: servers.ServerProcess) -> None:
    _grant(one_server.port, _without("+eval", *NO_FUNCTIONS))
    client = _user(one_server.port)
    with pytest.raises(redlease.BackendError) as caught:
        redlease.Lock(client, "x").acquire(timeout=5)
    message = str(caught.value)
    assert re.search(r"the ACL user ('locker' )?may not run EVAL: add \+eval", message), message
    assert str(one_server.port) in message  # the server is named
    client.close()


async def test_without_eval_asyncio(one_server: servers.ServerProcess) -> None:
    _grant(one_server.port, _without("+eval", *NO_FUNCTIONS))
    client = _auser(one_server.port)
    with pytest.raises(redlease.BackendError, match=r"may not run EVAL: add \+eval"):
        await redlease.AsyncLock(client, "x").acquire(timeout=5)
    await client.aclose()


def test_a_command_a_script_calls_is_named(one_server: servers.ServerProcess) -> None:
    # Redis 7.0 tells only the script and its line; Valkey names the command
    _grant(one_server.port, _without("+time"))
    client = _user(one_server.port)
    with pytest.raises(
        redlease.BackendError, match=r"may not run TIME \(called by a script\): add \+time"
    ):
        redlease.Lock(client, "x").acquire(timeout=5)
    client.close()


def test_without_the_key_pattern_the_error_gives_it(one_server: servers.ServerProcess) -> None:
    _grant(one_server.port, _without("~redlease:*") + " ~elsewhere:*")
    client = _user(one_server.port)
    with pytest.raises(redlease.BackendError, match=r"add ~redlease:\* "):
        redlease.Lock(client, "x").acquire(timeout=5)
    client.close()


def test_without_the_optional_parts_locks_still_work(one_server: servers.ServerProcess) -> None:
    hub = ("&redlease:*", "+subscribe", "+unsubscribe", "+publish", "+pubsub|numsub")
    optional = (*hub, "+client|id", "+client|unblock", "+config|get", "+type")
    _grant(one_server.port, _without(*optional))
    admin = families.client(port=one_server.port)
    admin.config_set("maxmemory-policy", "allkeys-lru")  # not seen: no warning, no failure
    client = _user(one_server.port)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lock = redlease.Lock(client, "x", ttl=5.0)
        lease = lock.acquire(timeout=5)
        # A wait given up on, on a bell, without CLIENT ID: set aside, not a failure
        with pytest.raises(redlease.AcquireTimeout):
            lock.acquire(timeout=0.2)
        threading.Timer(0.2, lease.release).start()
        lock.acquire(timeout=60).release()  # on a bell: no hub without channel rights
    admin.hset(lock_key("foreign"), "not", "a lock")
    with pytest.raises(redlease.LockError, match="wrong type") as caught:  # TYPE denied
        redlease.Lock(client, "foreign").acquire(timeout=5)
    assert not isinstance(caught.value, redlease.BackendError)
    admin.config_set("maxmemory-policy", "noeviction")
    # Looking while a waiter with every right queues through a hub: this user may not
    # ask whether the hub listens, so the waiter is judged by its entry's deadline
    held = redlease.Lock(admin, "x", ttl=30.0).acquire(timeout=5)
    other = redlease.Lock(admin, "x", ttl=30.0)
    waiting = threading.Thread(target=lambda: other.acquire(timeout=60).release())
    waiting.start()
    wait_until(lambda: admin.llen(LockKeys.for_name("x").queue) == 1, 30)
    assert lock.waiting() == 1
    (waiter,) = redlease.read_info(client, "x").waiters
    assert waiter.live
    held.release()
    waiting.join(60)
    admin.close()
    client.close()


# -- a replica -------------------------------------------------------------------------------


def test_a_replica_is_named_and_the_master_pointed_to(
    master_and_replica: tuple[servers.ServerProcess, servers.ServerProcess],
) -> None:
    _, replica = master_and_replica
    client = families.client(port=replica.port)
    with pytest.raises(redlease.BackendError) as caught:
        redlease.Lock(client, "x").acquire(timeout=5)
    message = str(caught.value)
    assert "read-only replica: point redlease at the master" in message
    assert "sentinel.master_for(" in message
    assert str(replica.port) in message
    client.close()


async def test_a_replica_is_named_asyncio(
    master_and_replica: tuple[servers.ServerProcess, servers.ServerProcess],
) -> None:
    _, replica = master_and_replica
    client = families.aclient(port=replica.port)
    with pytest.raises(redlease.BackendError, match=r"read-only replica: point redlease at"):
        await redlease.AsyncLock(client, "x").acquire(timeout=5)
    await client.aclose()


# -- authentication -------------------------------------------------------------------------


@pytest.fixture
def password_server(binary: servers.ServerBinary) -> Iterator[servers.ServerProcess]:
    """A server that asks for a password (set once it answers: the start probes it)."""
    with servers.ServerProcess(binary) as server:
        admin = families.client(port=server.port)
        admin.config_set("requirepass", "s3cret")
        admin.close()
        yield server


def test_an_unauthenticated_client_is_told_to_authenticate(
    password_server: servers.ServerProcess,
) -> None:
    client = families.client(port=password_server.port)
    with pytest.raises(redlease.BackendError) as caught:
        redlease.Lock(client, "x").acquire(timeout=5)
    message = str(caught.value)
    assert "authentication required" in message
    assert "Protocol error" not in message.split("(", 1)[0]
    assert str(password_server.port) in message
    client.close()
    wrong = families.client(port=password_server.port, password="nope")
    with pytest.raises(redlease.BackendError, match="authentication failed: wrong username"):
        redlease.Lock(wrong, "x").acquire(timeout=5)
    wrong.close()


async def test_an_unauthenticated_client_is_told_asyncio(
    password_server: servers.ServerProcess,
) -> None:
    client = families.aclient(port=password_server.port)
    with pytest.raises(redlease.BackendError) as caught:
        await redlease.AsyncLock(client, "x").acquire(timeout=5)
    assert "authentication required" in str(caught.value)
    assert str(password_server.port) in str(caught.value)
    await client.aclose()


def test_redlease_run_works_with_the_rule(one_server: servers.ServerProcess) -> None:
    """The run's first look at the server (a PING, which the rule does not grant) is
    answered with a refusal, and a refusal is an answer: the run goes on."""
    import subprocess
    import sys

    _grant(one_server.port, RULE)
    url = f"redis://{USER}:{PASSWORD}@127.0.0.1:{one_server.port}"
    done = subprocess.run(
        [sys.executable, "-m", "redlease", "run", "acl-run", "--redis", url, "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
