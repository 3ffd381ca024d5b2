"""The key layout (issue 17, item 3): different locks never share a key, every key of a lock
is in one hash slot, and redlease's keys stay out of the application's way."""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import redlease
from families import ClientFamily
from redlease._rules.keys import DEFAULT_PREFIX, LockKeys
from redlease.tools import servers
from waiting_helpers import wait_until

# Names and prefixes drawn mostly from the characters that matter to the layout.
_SPECIAL = st.sampled_from(
    ["{", "}", "%", ":", "%7B", "%7D", "%25", "#", "@", ":queue", "é", "\x00"]
)
_TEXT = st.lists(_SPECIAL | st.characters(codec="utf-8"), max_size=12).map("".join)
NAMES = _TEXT.filter(bool)
PREFIXES = _TEXT.map(lambda p: p.replace("{", "").replace("}", ""))
TOKENS = st.text(alphabet="0123456789abcdef", min_size=1, max_size=8)


def _all_keys(keys: LockKeys, token: str) -> set[str]:
    """Every key and channel a lock (or semaphore, read/write lock, election) writes or
    rings, for one waiter token and hub."""
    return {
        keys.lock,
        keys.fence,
        keys.queue,
        keys.lock + ":released",
        keys.lock + ":observers",  # an election's
        keys.bell(token),
        keys.bell_prefix + "@" + token,
        *keys.extra,
    }


LAYOUTS = {
    "lock": LockKeys.for_name,
    "semaphore": LockKeys.for_semaphore,
    "read/write": LockKeys.for_read_write,
    "election": LockKeys.for_election,
}


def _hash_tag(key: str) -> str:
    """What Redis Cluster hashes: the text between the first "{" and the next "}", if not
    empty; otherwise the whole key."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    if start < 0 or end < 0 or end == start + 1:
        return key
    return key[start + 1 : end]


@settings(max_examples=1000, deadline=None)
@given(NAMES, PREFIXES, NAMES, PREFIXES, TOKENS)
def test_different_locks_never_share_a_key(
    name: str, prefix: str, other: str, other_prefix: str, token: str
) -> None:
    if (name, prefix) == (other, other_prefix):
        return
    ours, theirs = LockKeys.for_name(name, prefix), LockKeys.for_name(other, other_prefix)
    assert _all_keys(ours, token).isdisjoint(_all_keys(theirs, token))


@settings(max_examples=1000, deadline=None)
@given(
    NAMES,
    PREFIXES,
    NAMES,
    PREFIXES,
    TOKENS,
    st.sampled_from(list(LAYOUTS)),
    st.sampled_from(list(LAYOUTS)),
)
def test_different_primitives_never_share_a_key(
    name: str, prefix: str, other: str, other_prefix: str, token: str, kind: str, other_kind: str
) -> None:
    """A lock, a semaphore, a read/write lock and an election of any names: the same name
    and prefix of two kinds, too, are apart."""
    if (name, prefix, kind) == (other, other_prefix, other_kind):
        return
    ours, theirs = LAYOUTS[kind](name, prefix), LAYOUTS[other_kind](other, other_prefix)
    assert _all_keys(ours, token).isdisjoint(_all_keys(theirs, token))
    assert {_hash_tag(k) for k in _all_keys(ours, token)} == {_hash_tag(ours.lock)}


def _read_back(key: str) -> tuple[str, str, str]:
    """(prefix, name, suffix) from a key: the layout's inverse, written independently."""
    prefix, _, rest = key.partition("{")
    escaped, _, suffix = rest.partition("}")
    name = escaped.replace("%7B", "{").replace("%7D", "}").replace("%25", "%")
    assert name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D") == escaped
    return prefix, name, suffix


@settings(max_examples=500, deadline=None)
@given(NAMES, PREFIXES, TOKENS)
def test_every_key_reads_back_to_its_prefix_and_name(name: str, prefix: str, token: str) -> None:
    keys = LockKeys.for_name(name, prefix)
    suffixes = {_read_back(key)[2] for key in _all_keys(keys, token)}
    assert {_read_back(key)[:2] for key in _all_keys(keys, token)} == {(prefix, name)}
    assert suffixes == {"", ":fence", ":line", ":released", ":observers"} | {
        ":bell:" + token,
        ":bell:@" + token,
    }


@settings(max_examples=500, deadline=None)
@given(NAMES, PREFIXES, TOKENS)
def test_every_key_of_a_lock_has_the_names_hash_tag(name: str, prefix: str, token: str) -> None:
    keys = LockKeys.for_name(name, prefix)
    tags = {_hash_tag(key) for key in _all_keys(keys, token)}
    assert len(tags) == 1
    assert tags != {keys.lock}  # a real tag, never the whole key (an empty "{}")
    assert keys.lock.startswith(prefix + "{")


def test_the_default_prefix_is_redleases_own() -> None:
    assert DEFAULT_PREFIX
    assert LockKeys.for_name("user:1").lock == DEFAULT_PREFIX + "{user:1}"
    # an empty prefix gives the unprefixed layout of names without "%", "{" and "}"
    assert LockKeys.for_name("user:1", "").lock == "{user:1}"


def _old_digest_alias(name: str) -> str:
    """The name whose key the old layout gave to a name starting with "}"."""
    return "#" + hashlib.sha1(name.encode()).hexdigest()[:24]


def test_a_name_starting_with_a_brace_and_its_old_alias_are_two_locks(r: Any, name: str) -> None:
    braced = "}" + name
    alias = _old_digest_alias(braced)
    with redlease.Lock(r, braced, ttl=5.0).acquire(timeout=1.0) as one:
        two = redlease.Lock(r, alias, ttl=5.0).try_acquire()
        assert two is not None, "the two names shared one lock"
        two.release()
        one.check()  # still ours


def _served_in_turn(client: Any, name: str) -> None:
    """A holder releases to a queued waiter: the release script writes the queue, the
    waiters table, the lock and the counter in one step (one slot, or CROSSSLOT)."""
    lock = redlease.Lock(client, name, ttl=5.0)
    holder = lock.acquire(timeout=2.0)
    got: list[redlease.Lease] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=10.0)))
    waiter.start()
    wait_until(lambda: client.llen(LockKeys.for_name(name).queue) >= 1)
    holder.release()
    waiter.join(timeout=15.0)
    assert len(got) == 1
    assert got[0].fence > holder.fence
    got[0].release()


def test_names_with_braces_on_a_cluster(
    cluster: list[servers.ServerProcess], family: ClientFamily, name: str
) -> None:
    client = family.cluster(cluster[0].port)
    try:
        for odd in ("}" + name, name + "{x}", "{" + name + "}", "a}b{c" + name, "%7B" + name):
            _served_in_turn(client, odd)
    finally:
        client.close()


def test_an_application_key_spelled_like_the_old_lock_key_breaks_nothing(r: Any, name: str) -> None:
    r.hset("{" + name + "}", "field", "the application's own")  # no TTL, another type
    r.set("{" + name + "}:queue", "also the application's")
    try:
        with redlease.Lock(r, name, ttl=5.0).acquire(timeout=1.0):
            pass
        assert r.hget("{" + name + "}", "field") == b"the application's own"
    finally:
        r.delete("{" + name + "}", "{" + name + "}:queue")


@pytest.mark.parametrize("which", ["lock", "queue"])
def test_a_key_of_the_wrong_type_is_named_not_waited_on(r: Any, name: str, which: str) -> None:
    keys = LockKeys.for_name(name)
    key = getattr(keys, which)
    if which == "lock":
        r.hset(key, "x", "y")
    else:
        r.set(keys.lock, "another holder", px=60_000)
        r.set(key, "not a " + which, px=60_000)
    r.expire(key, 60)
    lock = redlease.Lock(r, name, ttl=5.0)
    with pytest.raises(redlease.LockError) as raised:
        lock.acquire(timeout=30.0)
    assert not isinstance(raised.value, redlease.AcquireTimeout)
    assert repr(key) in str(raised.value)
    r.delete(keys.lock, key)
