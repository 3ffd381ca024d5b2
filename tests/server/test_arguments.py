"""Bad input gets a clear error naming the argument, before anything reaches a server."""

from __future__ import annotations

import math
import warnings
from datetime import timedelta
from typing import Any, cast

import pytest
import redis
import redis.asyncio as aredis
import redis.sentinel

import redlease

# A client that is never connected: argument checks must fail before any I/O.
CLIENT = redis.Redis(port=1)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"ttl": 0}, "ttl"),
        ({"ttl": -1.0}, "ttl"),
        ({"ttl": math.inf}, "ttl"),
        ({"ttl": math.nan}, "ttl"),
        ({"ttl": 10**13}, "ttl"),
        ({"ttl": "10"}, "ttl"),
        ({"ttl": True}, "ttl"),
        ({"ttl": timedelta(seconds=-1)}, "ttl"),
        ({"name": ""}, "name"),
        ({"name": 42}, "name"),
        ({"fair": "yes"}, "fair"),
        ({"on_lost": 3}, "on_lost"),
        ({"max_hold": 0}, "max_hold"),
        ({"prefix": "a{b"}, "prefix"),
        ({"name": "job\udc80"}, "name must be encodable as UTF-8"),
        ({"prefix": "\ud800locks:"}, "prefix must be encodable as UTF-8"),
        ({"replicas": 1, "replica_timeout": 1e300}, "replica_timeout"),
        ({"replicas": 1, "replica_timeout": 1.0}, "replica_timeout must be shorter than"),
        ({"replicas": 1, "replica_timeout": 0}, "replica_timeout"),
        ({"max_hold": 5.0}, "max_hold bounds auto_renew"),
        ({"auto_renew": True, "clock": lambda: 0.0}, "clock cannot be combined with auto_renew"),
        # numbers beyond any float, or any repr
        ({"ttl": 10**400}, "ttl must be finite"),
        ({"ttl": 1e306}, "ttl must be at most"),
        ({"replicas": -(10**5000)}, "replicas must not be negative"),
        ({"replicas": 2**64}, "replicas must be at most 1000"),
        ({"clock": print}, "clock must return monotonic seconds"),
        ({"clock": lambda: math.nan}, "clock must return monotonic seconds"),
        ({"clock": lambda: 1 / 0}, "clock\\(\\) failed"),
    ],
)
def test_bad_lock_arguments_name_the_argument(kwargs: dict[str, Any], names: str) -> None:
    args: dict[str, Any] = {"name": "x", "ttl": 1.0, **kwargs}
    with pytest.raises(redlease.InvalidArgument, match=names):
        redlease.Lock(CLIENT, args.pop("name"), args.pop("ttl"), **args)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"name": "job\udc80"}, "name must be encodable as UTF-8"),
        ({"max_hold": 5.0}, "max_hold bounds auto_renew"),
        ({"auto_renew": True, "clock": lambda: 0.0}, "clock cannot be combined with auto_renew"),
        ({"node_timeout": 1e19}, "node_timeout must not be longer than the ttl"),
        ({"node_timeout": 1.5}, "node_timeout must not be longer than the ttl"),
        ({"node_timeout": 10**400}, "node_timeout must be finite"),
    ],
)
def test_bad_redlock_arguments_name_the_argument(kwargs: dict[str, Any], names: str) -> None:
    nodes = [redis.Redis(port=1), redis.Redis(port=2), redis.Redis(port=3)]
    args: dict[str, Any] = {"name": "x", **kwargs}
    with pytest.raises(redlease.InvalidArgument, match=names):
        redlease.Redlock(nodes, args.pop("name"), 1.0, **args)


def test_good_combinations_are_taken() -> None:
    lock = redlease.Lock(CLIENT, "x", ttl=1.0, auto_renew=True, max_hold=5.0)
    assert lock.name == "x"
    redlease.Lock(CLIENT, "x", ttl=1.0, replicas=1, replica_timeout=0.5)
    redlease.Lock(CLIENT, "caf\u00e9 \U0001f512", ttl=1.0, clock=lambda: 0.0)


@pytest.mark.parametrize("timeout", [-0.1, math.nan, "1", [1]])
def test_bad_timeout_names_the_argument(timeout: Any) -> None:
    lock = redlease.Lock(CLIENT, "x")
    with pytest.raises(redlease.InvalidArgument, match="timeout"):
        lock.acquire(timeout=timeout)


def test_invalid_argument_is_value_and_type_error() -> None:
    with pytest.raises(ValueError, match="ttl"):
        redlease.Lock(CLIENT, "x", ttl=-1)
    with pytest.raises(TypeError, match="ttl"):
        redlease.Lock(CLIENT, "x", ttl=cast(Any, "1"))


def test_client_kind_is_checked() -> None:
    with pytest.raises(redlease.InvalidArgument, match="client"):
        redlease.Lock(object(), "x")
    with pytest.raises(redlease.InvalidArgument, match="client must be a client, not the class"):
        redlease.Lock(redis.Redis, "x")
    with pytest.raises(redlease.InvalidArgument, match="client must be a client, not the class"):
        redlease.AsyncLock(aredis.Redis, "x")
    sentinel = cast(Any, redis.sentinel).Sentinel([("127.0.0.1", 1)])  # (untyped)
    with pytest.raises(redlease.InvalidArgument, match="client is a Sentinel manager"):
        redlease.Lock(sentinel, "x")
    with pytest.raises(redlease.InvalidArgument, match=r"nodes.*not the class"):
        redlease.Redlock([CLIENT, redis.Redis(port=2), redis.Redis], "x")
    with pytest.raises(redlease.InvalidArgument, match="AsyncLock"):
        redlease.Lock(aredis.Redis(port=1), "x")
    with pytest.raises(redlease.InvalidArgument, match="client"):
        redlease.AsyncLock(CLIENT, "x")


def test_lease_extend_checks_ttl(r: redis.Redis, name: str) -> None:
    lease = redlease.Lock(r, name).acquire()
    with pytest.raises(redlease.InvalidArgument, match="ttl"):
        lease.extend(-5)
    lease.release()


def test_redlock_over_fewer_than_three_nodes_warns() -> None:
    for count in (1, 2):
        nodes = [redis.Redis(port=1 + i) for i in range(count)]
        with pytest.warns(redlease.RedleaseWarning, match="tolerates no node failure") as seen:
            redlease.Redlock(nodes, "x", 1.0)
        assert seen[0].filename == __file__  # pointed at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        redlease.Redlock([redis.Redis(port=1 + i) for i in range(3)], "x", 1.0)
