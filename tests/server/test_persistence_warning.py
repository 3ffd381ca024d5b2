"""A Redlock node that keeps nothing on disk is named, once, with a RedleaseWarning: its
fences then rely on the clock rule alone. A node whose CONFIG is denied is not."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

import families
import redlease
from redlease.tools import servers
from test_acl import _grant, _user, _without


@pytest.fixture
def mixed_nodes(binary: servers.ServerBinary) -> Iterator[list[servers.ServerProcess]]:
    """Three nodes: the first keeps nothing on disk, the others an append-only file."""
    nodes = [servers.ServerProcess(binary).start()]
    try:
        for _ in range(2):
            nodes.append(servers.ServerProcess(binary, appendfsync_always=True).start())
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _persistence_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "keeps nothing on disk" in str(w.message)]


def test_redlock_warns_once_per_node_without_persistence(
    mixed_nodes: list[servers.ServerProcess],
) -> None:
    clients = [families.client(port=n.port) for n in mixed_nodes]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        redlease.Redlock(clients, "x", ttl=5.0).acquire(timeout=10).release()
        redlease.Redlock(clients, "y", ttl=5.0).acquire(timeout=10).release()
    said = _persistence_warnings(caught)
    assert len(said) == 1, said  # once, for the one node
    assert str(mixed_nodes[0].port) in said[0]
    assert all(w.category is redlease.RedleaseWarning for w in caught)
    for client in clients:
        client.close()


def test_a_snapshot_schedule_counts_as_persistence(
    mixed_nodes: list[servers.ServerProcess],
) -> None:
    clients = [families.client(port=n.port) for n in mixed_nodes]
    clients[0].config_set("save", "3600 1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        redlease.Redlock(clients, "x", ttl=5.0).acquire(timeout=10).release()
    assert _persistence_warnings(caught) == []
    for client in clients:
        client.close()


async def test_redlock_warns_without_persistence_asyncio(
    mixed_nodes: list[servers.ServerProcess],
) -> None:
    clients = [families.aclient(port=n.port) for n in mixed_nodes]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await (await redlease.AsyncRedlock(clients, "x", ttl=5.0).acquire(timeout=10)).release()
    assert len(_persistence_warnings(caught)) == 1
    for client in clients:
        await client.aclose()


def test_redlock_without_config_rights_does_not_warn(
    mixed_nodes: list[servers.ServerProcess],
) -> None:
    for node in mixed_nodes:
        _grant(node.port, _without("+config|get"))
    clients = [_user(n.port) for n in mixed_nodes]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        redlease.Redlock(clients, "x", ttl=5.0).acquire(timeout=10).release()
    for client in clients:
        client.close()
