"""Scripts as Redis functions: the library loaded once per server and called by FCALL
(Redis 7+, Valkey), loaded again when the server lost it, on every node of a Cluster;
EVALSHA where the server has no functions (Redis 6.2) or the user may not use them."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

import families
import redlease
from families import ClientFamily
from redlease._rules import scripts as _scripts
from redlease._rules.acl import acl_rule
from redlease._rules.classify import plain
from redlease._rules.keys import LockKeys
from redlease.tools import servers
from waiting_helpers import lock_key, wait_until

LIBRARY = _scripts.library().name
USER, PASSWORD = "functions-user", "pw"


@pytest.fixture
def fresh(binary: servers.ServerBinary) -> Iterator[servers.ServerProcess]:
    """A server of its own: these tests flush and count what it ran."""
    with servers.ServerProcess(binary) as server:
        yield server


def _admin(port: int) -> Any:
    """A client with every right (untyped: the tests send it raw commands)."""
    return families.client(port=port)


def _has_functions(admin: Any) -> bool:
    return int(str(admin.info("server")["redis_version"]).split(".")[0]) >= 7


def _calls(admin: Any) -> dict[str, int]:
    """How many times the server ran each command: fcall, evalsha, eval, function|load."""
    stats = admin.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def _libraries(admin: Any) -> list[str]:
    found = admin.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "redlease_*")
    names = []
    for entry in found:
        fields = (
            entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=True))
        )
        name = fields.get(b"library_name", fields.get("library_name"))
        names.append(name.decode() if isinstance(name, bytes) else str(name))
    return names


def _cycle(client: Any, name: str = "x") -> None:
    lease = redlease.Lock(client, name, ttl=10.0).acquire(timeout=5)
    lease.extend(10.0)
    lease.release()
    assert lease.released


def test_a_server_with_functions_loads_the_library_once_and_calls_it(
    fresh: servers.ServerProcess,
) -> None:
    admin = _admin(fresh.port)
    if not _has_functions(admin):
        pytest.skip("the server has no functions")
    clients = [families.client(port=fresh.port) for _ in range(2)]  # two pools
    for client in clients:
        for _ in range(3):
            _cycle(client)
    assert _libraries(admin) == [LIBRARY]
    calls = _calls(admin)
    # each pool's first call goes after the library's load (no round trip more on a
    # server without it); the second pool's found it there
    assert calls.get("function|load") == 2
    # and goes as EVAL (one round trip on any server); the rest by FCALL
    assert calls.get("eval") == 2
    assert calls.get("fcall", 0) == 16
    assert "evalsha" not in calls
    for client in (*clients, admin):
        client.close()


def test_a_server_without_functions_is_sent_scripts(fresh: servers.ServerProcess) -> None:
    admin = _admin(fresh.port)
    if _has_functions(admin):
        pytest.skip("the server has functions")
    client = families.client(port=fresh.port)
    for _ in range(3):
        _cycle(client)
    calls = _calls(admin)
    assert calls.get("evalsha", 0) >= 6
    assert calls.get("eval", 0) <= 3
    client.close()
    admin.close()


@pytest.mark.parametrize("lost", ["FUNCTION FLUSH", "restart without data"])
def test_a_library_lost_is_loaded_again(
    fresh: servers.ServerProcess, lost: str, binary: servers.ServerBinary
) -> None:
    """The lease taken before the server lost the library is extended and released
    after; a new lock works."""
    admin = _admin(fresh.port)
    if not _has_functions(admin):
        pytest.skip("the server has no functions")
    client = families.client(port=fresh.port)
    lease = redlease.Lock(client, "x", ttl=30.0).acquire(timeout=5)
    if lost == "FUNCTION FLUSH":
        admin.execute_command("FUNCTION", "FLUSH")
        assert _libraries(admin) == []
        lease.extend(30.0)
        assert admin.pttl(lock_key("x")) > 20_000
        lease.release()
        assert not admin.exists(lock_key("x"))
    else:
        fresh.restart()  # (it keeps nothing on disk)
        admin = _admin(fresh.port)
        with pytest.raises(redlease.LockLost):
            lease.extend(30.0)  # (its key went with the data)
    _cycle(client)
    assert _libraries(admin) == [LIBRARY]
    client.close()
    admin.close()


def test_the_renewer_loads_the_library_again(fresh: servers.ServerProcess) -> None:
    """The renewer's pipeline meets "function not found", loads, and renews."""
    admin = _admin(fresh.port)
    if not _has_functions(admin):
        pytest.skip("the server has no functions")
    client = families.client(port=fresh.port)
    lease = redlease.Lock(client, "x", ttl=1.0, auto_renew=True).acquire(timeout=5)
    admin.execute_command("FUNCTION", "FLUSH")
    loads = _calls(admin).get("function|load", 0)
    wait_until(lambda: _calls(admin).get("function|load", 0) > loads, 30)
    time.sleep(1.5)  # past the ttl: held only if renewed
    assert not lease.lost
    assert admin.pttl(lock_key("x")) > 0
    lease.release()
    client.close()
    admin.close()


def test_asyncio_loads_the_library_again(fresh: servers.ServerProcess) -> None:
    admin = _admin(fresh.port)
    if not _has_functions(admin):
        pytest.skip("the server has no functions")

    async def main() -> None:
        client = families.aclient(port=fresh.port)
        lock = redlease.AsyncLock(client, "x", ttl=30.0)
        lease = await lock.acquire(timeout=5)
        admin.execute_command("FUNCTION", "FLUSH")
        await lease.extend(30.0)
        assert admin.pttl(lock_key("x")) > 20_000
        await lease.release()
        await (await lock.acquire(timeout=5)).release()
        await client.aclose()

    asyncio.run(main())
    assert _libraries(admin) == [LIBRARY]
    assert "evalsha" not in _calls(admin)
    admin.close()


def test_a_user_without_functions_is_served_by_scripts(fresh: servers.ServerProcess) -> None:
    admin = _admin(fresh.port)
    if not _has_functions(admin):
        pytest.skip("the server has no functions")
    rule = acl_rule().replace("+fcall", "").replace("+function|load", "").split()
    admin.execute_command("ACL", "SETUSER", USER, "reset", "on", f">{PASSWORD}", *rule)
    client = families.client(port=fresh.port, username=USER, password=PASSWORD)
    for _ in range(3):
        _cycle(client)
    assert _libraries(admin) == []
    assert _calls(admin).get("evalsha", 0) >= 6  # (3 scripts, each sent once as EVAL)
    client.close()
    admin.close()


def test_a_user_who_may_not_load_calls_a_library_loaded(fresh: servers.ServerProcess) -> None:
    """Without +function|load: scripts on a server without the library; once another
    user loaded it, its functions."""
    admin = _admin(fresh.port)
    if not _has_functions(admin):
        pytest.skip("the server has no functions")
    rule = acl_rule().replace("+function|load", "").split()
    admin.execute_command("ACL", "SETUSER", USER, "reset", "on", f">{PASSWORD}", *rule)
    client = families.client(port=fresh.port, username=USER, password=PASSWORD)
    _cycle(client)  # refused the load: scripts from now on, for this process's pool
    assert _libraries(admin) == []
    assert _calls(admin).get("eval", 0) >= 1
    _cycle(admin)  # an admin's process loads it
    later = families.client(port=fresh.port, username=USER, password=PASSWORD)
    fcalls = _calls(admin).get("fcall", 0)
    _cycle(later, "y")  # (its first call, after the load it may not make, as EVAL)
    assert _calls(admin).get("fcall", 0) == fcalls + 2
    for client_ in (client, later, admin):
        client_.close()


def test_a_cluster_is_sent_scripts_routed_by_the_client(
    cluster: list[servers.ServerProcess], family: ClientFamily
) -> None:
    """A Cluster client routes EVALSHA by its keys as it is; an FCALL's keys it would ask
    a node for first (COMMAND GETKEYS), a round trip more on every call, or refuse to
    send on Redis 6.2: so scripts, not functions, go through it."""
    admins = [_admin(node.port) for node in cluster]
    client = family.cluster(cluster[0].port)
    try:
        for i in range(30):  # (names in every node's slots)
            _cycle(client, f"spread-{i}")
        for admin in admins:
            calls = _calls(admin)
            assert calls.get("evalsha", 0) >= 1
            assert "fcall" not in calls
            assert "command|getkeys" not in calls
    finally:
        client.close()
        for admin in admins:
            admin.close()


def test_an_extension_runs_out_of_memory(fresh: servers.ServerProcess) -> None:
    """A server out of memory (noeviction) still extends a lease, as it did the script
    by EVAL: the extension adds no memory. A new lock is refused, by name."""
    admin = _admin(fresh.port)
    client = families.client(port=fresh.port)
    lease = redlease.Lock(client, "x", ttl=30.0).acquire(timeout=5)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    try:
        lease.extend(60.0)
        assert admin.pttl(lock_key("x")) > 40_000
        with pytest.raises(redlease.BackendError, match="out of memory"):
            redlease.Lock(client, "y").acquire(timeout=1)
    finally:
        admin.config_set("maxmemory", 0)
    lease.release()
    client.close()
    admin.close()


def test_an_error_in_a_function_is_said_at_its_files_line(fresh: servers.ServerProcess) -> None:
    """acquire.lua reads the lock after its fast path: a WRONGTYPE there, in the library,
    is that file's line."""
    admin = _admin(fresh.port)
    if not _has_functions(admin):
        pytest.skip("the server has no functions")
    admin.execute_command("FUNCTION", "LOAD", _scripts.library().source)
    keys = LockKeys.for_name("x")
    admin.hset(keys.lock, "a", "b")
    admin.pexpire(keys.lock, 60_000)
    args = ("t1", "5000", "1", "0", keys.bell_prefix, "1", "", "", "10000")
    with pytest.raises(Exception, match="WRONGTYPE") as raised:
        admin.fcall(_scripts.ACQUIRE.function, 3, *keys.script_keys, *args)
    text = str(raised.value)
    line = int(re.findall(r"user_function:(\d+)", text)[-1])
    file, number = _scripts.library().origin(line) or ("", 0)
    assert file == "acquire"
    assert _scripts.lua_file(file).splitlines()[number - 1].strip() == (
        "holder = redis.call('GET', lock)"
    )
    assert _scripts.place(_scripts.ACQUIRE.function, line) == f"acquire.lua:{number}"
    assert "user_function" not in plain(text)  # (the server's place, of no use, goes)
    admin.close()
