"""The client families the suite drives redlease through, by the name redlease gives
them (``redlease._clients``): how a test makes a client of each."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
import valkey
import valkey.asyncio
import valkey.asyncio.cluster
import valkey.asyncio.sentinel
import valkey.cluster
import valkey.sentinel


@dataclass(frozen=True)
class ClientFamily:
    name: str
    sync: ModuleType
    asyncio: ModuleType
    client_type: str  # "Redis", "Valkey"
    cluster_type: str  # "RedisCluster", "ValkeyCluster"

    def client(self, **options: Any) -> Any:
        """A sync standalone client (redis.Redis, valkey.Valkey...)."""
        return getattr(self.sync, self.client_type)(**options)

    def aclient(self, **options: Any) -> Any:
        """An asyncio standalone client."""
        return getattr(self.asyncio, self.client_type)(**options)

    def pool(self, **options: Any) -> Any:
        return self.sync.ConnectionPool(**options)

    def cluster(self, port: int) -> Any:
        """A sync Cluster client that starts from the node on ``port``."""
        module = self.sync.cluster
        return getattr(module, self.cluster_type)(
            startup_nodes=[module.ClusterNode("127.0.0.1", port)]
        )

    def acluster(self, port: int) -> Any:
        """An asyncio Cluster client that starts from the node on ``port``."""
        module = self.asyncio.cluster
        return getattr(module, self.cluster_type)(
            startup_nodes=[module.ClusterNode("127.0.0.1", port)]
        )

    def sentinel(self, port: int) -> Any:
        """A sync Sentinel client of the sentinel on ``port``."""
        return self.sync.sentinel.Sentinel([("127.0.0.1", port)])

    def asentinel(self, port: int) -> Any:
        """An asyncio Sentinel client of the sentinel on ``port``."""
        return self.asyncio.sentinel.Sentinel([("127.0.0.1", port)])

    @property
    def exceptions(self) -> ModuleType:
        return self.sync.exceptions  # type: ignore[no-any-return]


FAMILIES = {
    "redis-py": ClientFamily("redis-py", redis, redis.asyncio, "Redis", "RedisCluster"),
    "valkey-py": ClientFamily("valkey-py", valkey, valkey.asyncio, "Valkey", "ValkeyCluster"),
}
# Each server kind's whole suite runs through one family (the server's own project's
# client on it); tests/test_clients.py runs the contract through every pair.
HOME = {"redis": "redis-py", "valkey": "valkey-py"}
