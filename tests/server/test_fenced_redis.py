"""The fence gate for Redis data (``FencedRedis``, ``AsyncFencedRedis``) on real servers:
commands run only for a fence not older than the greatest passed, in one script, on the
lock's server or another one, standalone and Cluster. The tests that guard the gate fail
when its comparison is taken out of the script."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

import redlease
from families import ClientFamily
from redlease.tools import servers


def test_commands_run_for_a_fence_not_older_than_the_greatest(
    twin: Any, r: redis.Redis, name: str
) -> None:
    gate = twin.fenced(name)
    count, box = f"{{{name}}}:count", f"{{{name}}}:box"
    replies = gate.apply(
        5, [("SET", box, "five"), ("INCRBY", count, 2), ("HSET", f"{box}:h", "f", 1)]
    )
    assert [replies[1], replies[2]] == [2, 1]
    assert replies[0] in (b"OK", "OK", True)
    assert gate.apply(5, [("INCRBY", count, 1)]) == [3]  # the same fence, again
    assert gate.apply(9, [("SET", box, "nine")])
    assert gate.recorded() == 9
    assert r.get(gate.key) == b"9"
    assert 0 < r.pttl(gate.key) <= 86_400_000  # kept a day by default


def test_a_smaller_fence_runs_nothing_and_is_refused(twin: Any, r: redis.Redis, name: str) -> None:
    gate = twin.fenced(name)
    box, count = f"{{{name}}}:box", f"{{{name}}}:count"
    gate.apply(8, [("SET", box, "eight"), ("INCR", count)])
    with pytest.raises(redlease.StaleFence) as refused:
        gate.apply(7, [("SET", box, "seven"), ("INCR", count)])
    assert (refused.value.resource, refused.value.fence, refused.value.recorded) == (name, 7, 8)
    assert isinstance(refused.value, redlease.LockLost)
    assert (r.get(box), r.get(count), gate.recorded()) == (b"eight", b"1", 8)


def test_a_failing_command_is_reported_and_the_ones_before_it_stand(
    twin: Any, r: redis.Redis, name: str
) -> None:
    gate = twin.fenced(name)
    box = f"{{{name}}}:box"
    with pytest.raises(redlease.BackendError, match=r"commands\[1\] \(HSET\) failed: WRONGTYPE"):
        gate.apply(3, [("SET", box, "v"), ("HSET", box, "f", "v"), ("SET", f"{box}:2", "w")])
    assert (r.get(box), r.get(f"{box}:2")) == (b"v", None)


def test_values_go_through_as_given(twin: Any, r: redis.Redis, name: str) -> None:
    gate = twin.fenced(name)
    data = bytes(range(256))
    gate.apply(1, [("SET", f"{{{name}}}:raw", data), ("SET", f"{{{name}}}:n", 2.5)])
    assert (r.get(f"{{{name}}}:raw"), r.get(f"{{{name}}}:n")) == (data, b"2.5")


def test_the_record_lives_keep_past_the_last_fence(twin: Any, r: redis.Redis, name: str) -> None:
    gate = twin.fenced(name, keep=0.3)
    gate.apply(8, [("SET", f"{{{name}}}:box", "eight")])
    assert 0 < r.pttl(gate.key) <= 300
    time.sleep(0.5)
    assert gate.recorded() is None  # forgotten: the next fence passes, whatever it is
    gate.apply(2, [("SET", f"{{{name}}}:box", "two")])


def test_a_paused_holders_write_on_another_server_is_refused(
    twin: Any, r: redis.Redis, name: str, binary: servers.ServerBinary, family: ClientFamily
) -> None:
    """A is paused past its lease, B takes the lock and writes to the data's own server;
    A's late write, through the gate, changes nothing."""
    with servers.ServerProcess(binary) as data_server:
        data = family.client(port=data_server.port)
        try:
            gate = redlease.FencedRedis(data, name)
            lease_a = twin.lock(name, ttl=0.3).acquire()
            time.sleep(0.5)  # A is paused past its lease...
            lease_b = twin.lock(name, ttl=5).acquire()
            gate.apply(lease_b.fence, [("INCRBY", "balance", 50)])
            lease_b.release()
            with pytest.raises(redlease.StaleFence):  # ...and writes what it had computed
                gate.apply(lease_a.fence, [("SET", "balance", 100 - 30)])
            assert data.get("balance") == b"50"
        finally:
            data.close()


@pytest.mark.parametrize(
    ("commands", "message"),
    [
        ([], "commands must be a non-empty list"),
        ("SET k v", "commands must be a non-empty list"),
        ([("SET",)], r"commands\[0\] must name a command and its key"),
        (["SET k v"], r"commands\[0\] must be a tuple"),
        ([("MSET", "a", "1", "b", "2")], r"commands\[0\]: MSET is not taken"),
        ([("SET", "a", "1"), ("DEL", "a", "b")], r"commands\[1\]: DEL is not taken"),
        ([("EVAL", "return 1", "0")], "EVAL is not taken"),
        ([("SET", "a", None)], r"commands\[0\]'s arguments must be str, bytes"),
        ([("MGET", "a", "b")], r"commands\[0\]: MGET is not taken"),
        ([("SINTER", "a", "b")], r"commands\[0\]: SINTER is not taken"),
        ([("RPUSH", "a", *range(7001))], r"commands\[0\] has 7001 arguments"),
        # the key after a subcommand: not where the gate routes and checks it
        ([("XGROUP", "CREATE", "events", "g", "$")], r"commands\[0\]: XGROUP is not taken"),
        ([("SET", "k\ud800", "1")], r"commands\[0\]'s key must be encodable as UTF-8"),
        ([("SET", "k", "\ud800")], r"commands\[0\]'s arguments must be encodable as UTF-8"),
    ],
)
def test_commands_the_gate_does_not_take_are_refused_by_name(
    r: redis.Redis, name: str, commands: Any, message: str
) -> None:
    with pytest.raises(redlease.InvalidArgument, match=message):
        redlease.FencedRedis(r, name).apply(1, commands)


def test_bad_arguments_are_refused_by_name(r: redis.Redis, name: str) -> None:
    gate = redlease.FencedRedis(r, name)
    with pytest.raises(redlease.InvalidArgument, match="writes the gate's own record"):
        gate.apply(1, [("SET", gate.key, "1")])
    bad_fences: list[Any] = [True, -1, 2**53, "3"]
    for fence in bad_fences:
        with pytest.raises(redlease.InvalidArgument, match=r"^fence must be"):
            gate.apply(fence, [("SET", "a", "1")])
    for bad, message in (({"keep": 0}, "^keep must be positive"), ({"prefix": "a{b"}, "prefix")):
        with pytest.raises(redlease.InvalidArgument, match=message):
            redlease.FencedRedis(r, name, **bad)
    with pytest.raises(redlease.InvalidArgument, match=r"^resource must be"):
        redlease.FencedRedis(r, "")
    with pytest.raises(redlease.InvalidArgument, match="UTF-8"):
        redlease.FencedRedis(r, "bad\udcff")
    with pytest.raises(redlease.InvalidArgument, match="AsyncFencedRedis"):
        redlease.AsyncFencedRedis(r, name)


def test_on_a_cluster_keys_outside_the_resources_slot_are_refused(
    cluster: list[servers.ServerProcess], family: ClientFamily, name: str
) -> None:
    client = family.cluster(cluster[0].port)
    try:
        gate = redlease.FencedRedis(client, name)
        assert gate.tag == f"{{{name}}}"
        tagged = f"{gate.tag}:balance"
        odd = redlease.FencedRedis(client, "50% {off}")  # braces and "%" in the name
        assert odd.apply(1, [("INCR", f"{odd.tag}:k")]) == [1]
        assert gate.apply(4, [("INCRBY", tagged, 4)]) == [4]
        with pytest.raises(redlease.StaleFence):
            gate.apply(3, [("INCRBY", tagged, 3)])
        outside = next(
            k for k in (f"k{i}" for i in range(100)) if client.keyslot(k) != client.keyslot(tagged)
        )
        with pytest.raises(
            redlease.InvalidArgument, match=f"key '{outside}' is not in the hash slot"
        ):
            gate.apply(5, [("SET", tagged, "1"), ("SET", outside, "2")])
        assert client.get(tagged) == b"4"
    finally:
        client.close()
