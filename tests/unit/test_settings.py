"""The one look at a server's settings (``_rules.settings``): what weakens the locks,
how long the look may take, once per server, and a warning once per finding."""

from __future__ import annotations

import warnings
from typing import Any

import redlease
from redlease._rules import flows as _flows
from redlease._rules import settings as _settings
from redlease._wire.errors import backend_error


def test_only_a_policy_that_evicts_is_a_weakness() -> None:
    assert _settings.weakness([b"maxmemory-policy", b"noeviction"]) is None
    assert _settings.weakness({"maxmemory-policy": "noeviction"}) is None  # RESP3's map
    assert _settings.weakness([]) is None  # (a server that does not say: nothing learnt)
    found = _settings.weakness([b"maxmemory-policy", b"allkeys-lru"])
    assert found is not None
    assert "'allkeys-lru'" in found
    assert _settings.weakness({b"maxmemory-policy": b"volatile-ttl"}) is not None


def test_keeping_nothing_on_disk_is_a_weakness_only_when_the_reply_tells() -> None:
    nothing = [b"maxmemory-policy", b"noeviction", b"appendonly", b"no", b"save", b""]
    found = _settings.weakness(nothing)
    assert found is not None
    assert "keeps nothing on disk" in found
    snapshots = [b"appendonly", b"no", b"save", b"3600 1"]
    assert _settings.weakness(snapshots) is None
    assert _settings.weakness([b"appendonly", b"yes", b"save", b""]) is None
    assert _settings.weakness([b"appendonly", b"no"]) is None  # save not asked for
    both = _settings.weakness([*nothing[2:], b"maxmemory-policy", b"allkeys-lru"])
    assert both is not None
    assert "'allkeys-lru'" in both
    assert "keeps nothing on disk" in both


def test_the_look_takes_what_the_acquire_has_left_or_waits_for_a_later_one() -> None:
    assert _settings.Look(0.25).due(None) == 0.25
    assert _settings.Look(0.25).due(0.1) == 0.1
    assert _settings.Look(0.25).due(3.0) == 0.25
    look = _settings.Look(0.25)
    assert look.due(_settings.MIN_LOOK / 2) is None  # too little time: a later one looks
    assert look.due(0.0) is None
    assert not look.done
    assert look.due(1.0) == 0.25
    assert look.done
    assert look.due(1.0) is None  # once


def test_the_looks_fit_in_a_try() -> None:
    assert _settings.eviction_policy(0.2).timeout == 0.2
    assert _settings.node_settings(0.1).args[:2] == ("CONFIG", "GET")
    assert _settings.SETTINGS_WAIT + _flows.PAST_DEADLINE < _flows.TRY_BOUND


def test_a_server_is_looked_at_once_per_pool_or_else_per_client() -> None:
    pool, client, other = object, type("C", (), {}), type("D", (), {})  # (weakly kept)
    assert _settings.first_look(pool, client)
    assert not _settings.first_look(pool, other)  # the same pool, another client
    assert _settings.first_look(None, client)
    assert not _settings.first_look(None, client)
    assert _settings.first_look(None, other)


def test_a_weakness_is_told_once_per_server_and_a_failed_look_says_nothing() -> None:
    tag = _flows.new_token()[:8]  # names of this run's own: told once per process
    names = [f"{tag}-a:6379", f"{tag}-b:6379"]
    evicting: Any = [b"maxmemory-policy", b"allkeys-lru"]
    failed = backend_error(TimeoutError("timed out"), "check", server=names[0])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _settings.warn_if_weak(names[0], failed)
        _settings.warn_if_weak(names[1], evicting)
        _settings.warn_if_weak(names[0], [b"maxmemory-policy", b"noeviction"])
    assert [w.category for w in seen] == [redlease.RedleaseWarning]
    assert str(seen[0].message).startswith(f"{names[1]}: ")
    assert "maxmemory-policy is 'allkeys-lru'" in str(seen[0].message)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        _settings.warn_if_weak(names[1], evicting)
    assert again == []
