"""``replicas=``: a grant or an extension counts only once replicas acknowledged it."""

from __future__ import annotations

import pytest

import families
import redlease
from redlease.tools import servers
from waiting_helpers import lock_key


def test_grant_waits_for_the_replica(
    master_and_replica: tuple[servers.ServerProcess, servers.ServerProcess],
) -> None:
    master, replica = master_and_replica
    client = families.client(port=master.port)
    lock = redlease.Lock(client, "replicated", ttl=5.0, replicas=1, replica_timeout=2.0)
    with lock as lease:
        assert (
            families.client(port=replica.port).get(lock_key("replicated")) == lease.token.encode()
        )
        lease.extend()
    client.close()


def test_no_acknowledgement_means_not_acquired(
    master_and_replica: tuple[servers.ServerProcess, servers.ServerProcess],
) -> None:
    master, replica = master_and_replica
    client = families.client(port=master.port)
    lock = redlease.Lock(client, "unreplicated", ttl=5.0, replicas=1, replica_timeout=0.2)
    replica.pause()
    try:
        with pytest.raises(redlease.BackendError, match="only 0 of 1 replicas"):
            lock.acquire(timeout=1)
        assert client.exists(lock_key("unreplicated")) == 0  # given back, not left behind
    finally:
        replica.resume()
    client.close()


def test_replicas_needs_a_plain_client() -> None:
    from redis.cluster import RedisCluster

    cluster = RedisCluster.__new__(RedisCluster)  # never connected: the check comes first
    with pytest.raises(redlease.InvalidArgument, match="replicas"):
        redlease.Lock(cluster, "x", replicas=1)
    with pytest.raises(redlease.InvalidArgument, match="replicas"):
        redlease.Lock(families.client(port=1), "x", replicas=-1)
