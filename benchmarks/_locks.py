"""The sync locks compared in the multi-process figures, behind one small interface.

Each worker process builds its own client and lock (nothing crosses a process boundary
but names, ports and results).
"""

from __future__ import annotations

from typing import Any, Protocol

import redis

import redlease

# kind -> label in the table
KINDS = {
    "redlease": "redlease Lock (fair, the default)",
    "redlease-unfair": "redlease Lock (fair=False)",
    "redis-py": "redis-py Lock (defaults: polls every 0.1 s)",
    "python-redis-lock": "python-redis-lock (BLPOP signal)",
    "ticket": "FIFO ticket baton (reference: no TTL, not a usable lock)",
    "pottery": "pottery Redlock, 1 master (retries after a random sleep)",
}
# compared in every multi-process figure; contention also shows redlease without fairness
PEERS = ("redlease", "redis-py", "python-redis-lock")
# and the plainest FIFO hand-over there is: what a wake-up per section costs on this machine
CONTENTION = (
    "redlease",
    "redlease-unfair",
    "redis-py",
    "python-redis-lock",
    "ticket",
)


class SyncLock(Protocol):
    def acquire(self, timeout: float | None = None) -> Any: ...

    def release(self, handle: Any) -> None: ...


class _Redlease:
    def __init__(
        self,
        client: redis.Redis,
        name: str,
        ttl: float,
        *,
        fair: bool = True,
    ) -> None:
        self._lock = redlease.Lock(client, name, ttl=ttl, fair=fair)

    def acquire(self, timeout: float | None = None) -> Any:
        return self._lock.acquire(timeout=timeout)

    def release(self, handle: Any) -> None:
        handle.release()


class _RedisPy:
    def __init__(self, client: redis.Redis, name: str, ttl: float) -> None:
        # Everything but the ttl is redis-py's default (a lock must expire).
        self._lock = client.lock(name, timeout=ttl)

    def acquire(self, timeout: float | None = None) -> Any:
        if not self._lock.acquire(blocking_timeout=timeout):
            raise TimeoutError("redis-py Lock: not acquired in time")
        return self._lock

    def release(self, handle: Any) -> None:
        handle.release()


class _PythonRedisLock:
    def __init__(self, client: redis.Redis, name: str, ttl: float) -> None:
        import redis_lock

        self._expire = max(1, round(ttl))
        self._lock = redis_lock.Lock(client, name, expire=self._expire)

    def acquire(self, timeout: float | None = None) -> Any:
        # python-redis-lock takes whole seconds (0 would mean "no timeout"), and refuses
        # a timeout longer than the lock's expiry.
        wait = None if timeout is None else min(max(1, int(timeout)), self._expire)
        if not self._lock.acquire(timeout=wait):
            raise TimeoutError("python-redis-lock: not acquired in time")
        return self._lock

    def release(self, handle: Any) -> None:
        handle.release()


class _Pottery:
    def __init__(self, client: redis.Redis, name: str, ttl: float) -> None:
        from pottery import Redlock

        self._lock = Redlock(key=name, masters={client}, auto_release_time=ttl)

    def acquire(self, timeout: float | None = None) -> Any:
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError("pottery Redlock: not acquired in time")
        return self._lock

    def release(self, handle: Any) -> None:
        handle.release()


class _Ticket:
    """A ticket lock: take a number (INCR), wait for it to be pushed (BLPOP); release
    pushes the next number. FIFO with one wake-up per hand-over and nothing else (no TTL,
    no owner check): the floor under any fair lock's contended cost, not a lock to use."""

    def __init__(self, client: redis.Redis, name: str, ttl: float) -> None:
        self._client, self._name = client, name

    def acquire(self, timeout: float | None = None) -> Any:
        number = int(self._client.incr(f"{self._name}:ticket"))
        if number > 1 and self._client.blpop([f"{self._name}:turn:{number}"], timeout or 0) is None:
            raise TimeoutError("ticket: not served in time")
        return number

    def release(self, handle: Any) -> None:
        self._client.lpush(f"{self._name}:turn:{handle + 1}", 1)


def make_lock(kind: str, client: redis.Redis, name: str, ttl: float) -> SyncLock:
    if kind == "redlease":
        return _Redlease(client, name, ttl)
    if kind == "redlease-unfair":
        return _Redlease(client, name, ttl, fair=False)
    if kind == "redis-py":
        return _RedisPy(client, name, ttl)
    if kind == "python-redis-lock":
        return _PythonRedisLock(client, name, ttl)
    if kind == "ticket":
        return _Ticket(client, name, ttl)
    if kind == "pottery":
        return _Pottery(client, name, ttl)
    raise ValueError(f"unknown lock kind {kind!r}")


_clients: dict[int, redis.Redis] = {}


def client(port: int) -> redis.Redis:
    """This process's client for ``port`` (made once, reused by later calls)."""
    found = _clients.get(port)
    if found is None:
        found = _clients[port] = redis.Redis(host="127.0.0.1", port=port)
    return found
