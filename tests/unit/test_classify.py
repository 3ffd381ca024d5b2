"""What a failure is (the clients' word), what it means and whether it may pass (the
rules', knowing no client), and the BackendError that carries both: no server."""

from __future__ import annotations

import pickle

import pytest
import redis

import redlease
from redlease._clients import NotRedis, ReplyTimedOut
from redlease._clients.errors import ReplyError, code_of, traits_of
from redlease._rules import classify
from redlease._wire.errors import backend_error


@pytest.mark.parametrize(
    ("exc", "traits", "code"),
    [
        (ReplyError("WRONGTYPE Operation against a key"), {"reply"}, "WRONGTYPE"),
        (redis.ResponseError("NOPERM no permissions"), {"response"}, "NOPERM"),
        (redis.ReadOnlyError("You can't write"), {"response", "readonly"}, "You"),
        (redis.BusyLoadingError("loading"), {"loading", "connection"}, ""),
        (redis.ConnectionError("refused"), {"connection"}, ""),
        (ReplyTimedOut("no reply"), {"timeout"}, ""),
        (TimeoutError("timed out"), {"timeout", "connection"}, ""),
        (NotRedis("HTTP/1.1"), {"not_redis", "connection"}, ""),
        (ValueError("a bug"), set(), ""),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None,
)
def test_the_clients_say_what_a_failure_is(exc: BaseException, traits: set[str], code: str) -> None:
    assert traits_of(exc) == traits
    assert code_of(exc) == code


@pytest.mark.parametrize(
    ("traits", "code", "text", "said", "passes"),
    [
        ({"reply"}, "WRONGTYPE", "WRONGTYPE x", "a key under redlease's prefix", False),
        ({"reply"}, "LOADING", "LOADING x", "still loading", True),
        ({"reply"}, "MASTERDOWN", "MASTERDOWN x", "lost its master", True),
        ({"reply"}, "BUSY", "BUSY x", "the server returned an error", False),
        ({"response", "readonly"}, "You", "You can't write", "read-only replica", False),
        ({"loading", "connection"}, "", "loading", "still loading", True),
        ({"timeout", "connection"}, "", "", "did not answer in time", True),
        ({"connection"}, "", "refused", "cannot be reached", True),
        ({"not_redis", "connection"}, "", "", "does not speak Redis", False),
        # a refusal its text names stays, whatever class carried it
        ({"denied", "connection"}, "", "invalid username-password pair", "wrong username", False),
        ({"response"}, "OOM", "OOM command not allowed", "out of memory", False),
        (set(), "", "a bug", "the server returned an error", False),
    ],
)
def test_the_rules_weigh_it_knowing_no_client(
    traits: set[str], code: str, text: str, said: str, passes: bool
) -> None:
    assert said in classify.meaning(frozenset(traits), code, text)
    assert classify.transient(frozenset(traits), code, text) is passes


def test_the_backend_error_carries_what_the_rules_read() -> None:
    error = backend_error(ReplyError("WRONGTYPE Operation against a key"), "acquire 'x'")
    assert error.code == "WRONGTYPE"
    assert not error.transient
    assert "a key under redlease's prefix" in error.reason
    assert str(error).startswith(f"acquire 'x' failed: {error.reason} (ReplyError: WRONGTYPE")
    assert classify.error_code(error) == "WRONGTYPE"
    assert not classify.passing(error)
    lost = backend_error(redis.ConnectionError("refused"), "acquire 'x'", server="h:1")
    assert lost.transient
    assert classify.passing(lost)
    assert classify.error_code(lost) == ""
    assert str(lost).startswith("acquire 'x' failed on h:1: the server cannot be reached")
    # what is not a BackendError, or one raised by the rules themselves, never passes
    assert not classify.passing(redis.ConnectionError("refused"))
    assert not classify.passing(redlease.BackendError("only 0 of 1 replicas acknowledged"))


def test_a_backend_error_keeps_what_it_carries_through_pickling() -> None:
    error = backend_error(ReplyError("LOADING the dataset"), "acquire 'x'")
    again = pickle.loads(pickle.dumps(error))
    assert (again.code, again.transient, again.reason) == ("LOADING", True, error.reason)
    assert str(again) == str(error)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("NOSCRIPT No matching script", "NOSCRIPT"),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", "WRONGTYPE"),
        ("", ""),
        # Redis 6.2 wraps what a script met: the inner code counts, with or without its "-"
        (
            f"ERR Error running script (call to f_{'a' * 40}): @user_script:42: "
            "@user_script: 42: -READONLY You can't write against a read only replica.",
            "READONLY",
        ),
        (
            f"ERR Error running script (call to f_{'b' * 40}): @user_script:102: "
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "WRONGTYPE",
        ),
        ("ERR Error running script somehow else", "ERR"),
    ],
)
def test_a_replys_code_is_its_first_word_or_the_one_a_script_met(text: str, code: str) -> None:
    assert classify.reply_code(text) == code
