"""The client families the suite drives redlease through, by the name redlease gives
them (``redlease._clients``): how a test makes a client of each."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.backoff
import redis.cluster
import redis.retry
import redis.sentinel
import valkey
import valkey.asyncio
import valkey.asyncio.cluster
import valkey.asyncio.retry
import valkey.asyncio.sentinel
import valkey.backoff
import valkey.cluster
import valkey.retry
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

    def cluster(self, port: int, **options: Any) -> Any:
        """A sync Cluster client that starts from the node on ``port``."""
        module = self.sync.cluster
        return getattr(module, self.cluster_type)(
            startup_nodes=[module.ClusterNode("127.0.0.1", port)], **options
        )

    def acluster(self, port: int, **options: Any) -> Any:
        """An asyncio Cluster client that starts from the node on ``port``."""
        module = self.asyncio.cluster
        return getattr(module, self.cluster_type)(
            startup_nodes=[module.ClusterNode("127.0.0.1", port)], **options
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
# client on it); tests/server/test_clients.py runs the contract through every pair.
HOME = {"redis": "redis-py", "valkey": "valkey-py"}


# The family of the test that runs now (set by conftest from the server kind it runs on):
# the helpers below make clients of it, so a test need not say which family it uses.
_current = FAMILIES["redis-py"]


def use(family: ClientFamily) -> None:
    global _current
    _current = family


def current() -> ClientFamily:
    return _current


def client(**options: Any) -> redis.Redis:
    """A sync client of the current family (typed as redis-py's: the API is the same)."""
    made: redis.Redis = _current.client(**options)
    return made


def aclient(**options: Any) -> redis.asyncio.Redis:
    made: redis.asyncio.Redis = _current.aclient(**options)
    return made


def pool(**options: Any) -> redis.ConnectionPool:
    made: redis.ConnectionPool = _current.pool(**options)
    return made


def blocking_pool(**options: Any) -> redis.BlockingConnectionPool:
    made: redis.BlockingConnectionPool = _current.sync.BlockingConnectionPool(**options)
    return made


def retry(retries: int) -> Any:
    """The current family's sync retry policy: ``retries`` tries, no backoff."""
    return _current.sync.retry.Retry(_current.sync.backoff.NoBackoff(), retries)


def aretry(retries: int) -> Any:
    """The same for its asyncio clients."""
    return _current.asyncio.retry.Retry(_current.sync.backoff.NoBackoff(), retries)


def slow_retry(retries: int, seconds: float) -> Any:
    """The current family's sync retry policy: ``retries`` tries, ``seconds`` apart."""
    return _current.sync.retry.Retry(_current.sync.backoff.ConstantBackoff(seconds), retries)


def aslow_retry(retries: int, seconds: float) -> Any:
    """The same for its asyncio clients."""
    return _current.asyncio.retry.Retry(_current.sync.backoff.ConstantBackoff(seconds), retries)


def errors() -> ModuleType:
    """The current family's exceptions module."""
    return _current.exceptions
