"""How a script goes on the wire (``_wire.resp.Wire``): as FCALL while the server takes
functions, the library loaded with a connection's first call and when found missing;
as EVALSHA / EVAL once functions are refused."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from redlease._async import io as _async_io
from redlease._clients.errors import ReplyError
from redlease._rules import scripts as _scripts
from redlease._rules.acl import called, script_commands
from redlease._rules.keys import LockKeys
from redlease._rules.ops import Call
from redlease._sync import io as _sync_io
from redlease._wire import resp

KEYS = LockKeys.for_name("x")
OP = Call(_scripts.EXTEND, KEYS.script_keys, ("t", "1000"), timeout=1.0)

MISSING = ReplyError("ERR Function not found")
UNKNOWN = ReplyError("ERR unknown command 'FCALL', with args beginning with: ")
DENIED = ReplyError("NOPERM User u has no permissions to run the 'fcall' command")
LOAD_DENIED = ReplyError("NOPERM User u has no permissions to run the 'function|load' command")
THERE = ReplyError(f"ERR Library '{_scripts.library().name}' already exists")
NOSCRIPT = ReplyError("NOSCRIPT No matching script. Please use EVAL.")
WRONGTYPE = ReplyError("WRONGTYPE Operation against a key holding the wrong kind of value")


def _command(data: bytes) -> bytes:
    """The first command's name in ``data``."""
    return data.split(b"\r\n")[2]


def test_a_script_goes_as_fcall_of_its_function() -> None:
    wire = resp.Wire()
    data = wire(OP)
    assert _command(data) == b"FCALL"
    assert _scripts.EXTEND.function.encode() in data


def test_the_first_call_on_a_lean_connection_goes_after_the_library() -> None:
    wire = resp.Wire()
    assert wire.first(lean=False) == b""  # (a client's connection class: no stale reads)
    first = wire.first(lean=True)
    assert _command(first) == b"FUNCTION"
    assert _scripts.library().source.encode() in first
    assert _command(wire(OP)) == b"EVAL"  # (runs on any server, one round trip)
    assert _command(wire(OP)) == b"FCALL"
    assert wire.first(lean=True) == b""
    wire.forget()  # (a connection given up on: not the library again)
    assert wire.first(lean=True) == b""
    wire.closed()  # the server closed one: it may have restarted empty
    assert wire.first(lean=True) != b""
    assert _command(wire(OP)) == b"EVAL"
    wire.heard(MISSING)  # a reply nobody waited for said it was missing
    assert wire.first(lean=True) != b""


def test_the_first_calls_load_refused_is_learnt_from_its_reply() -> None:
    wire = resp.Wire()
    wire.first(lean=True)
    wire.heard(LOAD_DENIED)  # may not load: the library may be there all the same
    assert wire.functions
    wire.heard(UNKNOWN)  # Redis 6.2 (or a stale FCALL's refusal): scripts
    assert not wire.functions
    assert _command(wire(OP)) == b"EVAL"
    assert _command(wire(OP)) == b"EVALSHA"


def test_a_stale_reply_that_is_no_error_changes_nothing() -> None:
    # (most stale replies: a Redlock node's late yes, a load's OK)
    wire = resp.Wire()
    wire.first(lean=True)
    _command(wire(OP))
    for reply in (1, b"OK", b"Function not found", [0, 0, 5], None):
        wire.heard(reply)
    assert wire.functions
    assert wire.first(lean=True) == b""  # (the library not sent again)
    assert _command(wire(OP)) == b"FCALL"


def test_a_user_without_eval_is_called_by_fcall() -> None:
    wire = resp.Wire()
    wire.first(lean=True)
    first = wire(OP)
    assert _command(first) == b"EVAL"
    again = wire.again(OP, ReplyError("NOPERM User u has no permissions to run the 'eval' command"))
    assert again is not None
    assert _command(again[0]) == b"FCALL"


def test_a_function_missing_is_loaded_with_the_call_again() -> None:
    wire = resp.Wire()
    again = wire.again(OP, MISSING)
    assert again is not None
    data, loading = again
    assert loading
    assert data.startswith(resp.function_load())
    assert data.endswith(resp.fcall(OP))
    wire.loaded(b"redlease_0")
    wire.loaded(THERE)  # another process was first
    assert wire.functions


def test_a_load_refused_means_scripts() -> None:
    wire = resp.Wire()
    wire.loaded(LOAD_DENIED)
    assert not wire.functions
    # the FCALL sent behind the load found nothing: it goes as EVAL
    again = wire.again(OP, MISSING)
    assert again is not None
    assert _command(again[0]) == b"EVAL"
    assert not again[1]


def test_functions_refused_means_scripts_from_then_on() -> None:
    for refusal in (UNKNOWN, DENIED):
        wire = resp.Wire()
        again = wire.again(OP, refusal)
        assert again is not None
        assert _command(again[0]) == b"EVAL"  # (its source: the server may lack it)
        assert not wire.functions
        assert _command(wire(OP)) == b"EVALSHA"
        assert wire.first(lean=True) == b""


def test_noscript_sends_the_source_and_other_errors_stand() -> None:
    wire = resp.Wire()
    wire.again(OP, UNKNOWN)
    again = wire.again(OP, NOSCRIPT)
    assert again is not None
    assert _command(again[0]) == b"EVAL"
    assert wire.again(OP, WRONGTYPE) is None
    assert resp.Wire().again(OP, WRONGTYPE) is None
    # a command a function called, refused: the function ran (in part): never again
    inside = ReplyError(
        "ERR Unknown command called from script script: redlease_0_release, on @user_function:12."
    )
    assert resp.Wire().again(OP, inside) is None
    wire.heard(NOSCRIPT)  # (stale: the scripts go with their source again)
    assert _command(wire(OP)) == b"EVAL"


# Commands that may add memory: a server out of memory refuses them (and a function
# without allow-oom before it starts). The others scripts call free or keep memory.
ADDS_MEMORY = frozenset({"set", "hset", "lpush", "rpush", "zadd"})


def test_allow_oom_is_said_exactly_by_the_scripts_that_add_no_memory() -> None:
    """A script that calls none of them ran out of memory as EVAL: as a function it says
    allow-oom, or it would be refused there (an extension, failing for want of memory it
    does not use). One that calls any of them must not (it would write past maxmemory).
    (Scripts that write nothing say no-writes instead.)"""
    for script in _scripts.every_script():
        if script.reads_only or script is _scripts.FENCED_APPLY:  # (runs the caller's commands)
            assert not script.allow_oom, script.name
            continue
        adds = bool(called(script.source) & ADDS_MEMORY)
        assert script.allow_oom == (not adds), script.name
    assert not ADDS_MEMORY - script_commands()  # (each is one the scripts do call)


class _SlowConnection:
    """A connection whose every reply takes ``EACH`` seconds, and which records how long
    each read was given; its wire asks for the library loaded with the call again."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.wire = self

    def again(self, op: object, error: BaseException) -> tuple[bytes, bool]:
        return b"", True

    def loaded(self, reply: object) -> None:
        pass

    def send(self, data: bytes) -> None:
        pass

    def read(self, timeout: float) -> str:
        self.waits.append(timeout)
        time.sleep(EACH)
        return "OK"


class _AsyncSlowConnection(_SlowConnection):
    async def send(self, data: bytes) -> None:  # type: ignore[override]
        pass

    async def read(self, timeout: float) -> str:  # type: ignore[override]
        self.waits.append(timeout)
        await asyncio.sleep(EACH)
        return "OK"


EACH = 0.05


def _sync_sent_again(end: float) -> list[float]:
    conn = _SlowConnection()
    assert _sync_io._sent_again(conn, OP, MISSING, end) == "OK"  # type: ignore[arg-type]
    return conn.waits


def _async_sent_again(end: float) -> list[float]:
    conn = _AsyncSlowConnection()
    sent = _async_io._sent_again(conn, OP, MISSING, end)  # type: ignore[arg-type]
    assert asyncio.run(sent) == "OK"
    return conn.waits


@pytest.mark.parametrize("sent_again", [_sync_sent_again, _async_sent_again])
def test_a_call_sent_again_waits_in_the_time_its_first_send_had_left(
    sent_again: Callable[[float], list[float]],
) -> None:
    """The library's load and the call sent again share the call's deadline: each read
    waits for what is left of it, not for the whole timeout again."""
    load, call = sent_again(time.monotonic() + 0.3)
    assert load <= 0.3
    assert call <= 0.3 - EACH  # (the load's reply took EACH of it)


class _OwnRetriesClient:
    """A client redlease does not take over (no known family): calls go through its
    methods, and its own retries would send them again as they are."""

    def __init__(self) -> None:
        self.sent: list[tuple[object, ...]] = []

    def evalsha(self, sha: str, n: int, *keys_and_args: object) -> list[int]:
        self.sent.append(keys_and_args[n:])
        return [0]


class _AsyncOwnRetriesClient(_OwnRetriesClient):
    async def evalsha(self, sha: str, n: int, *keys_and_args: object) -> list[int]:  # type: ignore[override]
        return super().evalsha(sha, n, *keys_and_args)


def test_a_call_through_a_clients_own_methods_goes_with_the_arguments_for_a_second_send() -> None:
    """The client may send it twice (its own retries): the first send carries what a
    second needs (a first try that may queue asks for its place to be searched for)."""
    op = Call(_scripts.ACQUIRE, KEYS.script_keys, ("t", ""), 1.0, again=("t", "again"))
    plain = Call(_scripts.ACQUIRE, KEYS.script_keys, ("t", "P"), 1.0)
    client = _OwnRetriesClient()
    sync_io = _sync_io.IO(client)
    assert not sync_io.direct
    sync_io._client_call(op)
    sync_io._client_call(plain)
    aclient = _AsyncOwnRetriesClient()
    async_io = _async_io.AsyncIO(aclient)
    asyncio.run(async_io._client_call(op))
    assert client.sent == [("t", "again"), ("t", "P")]
    assert aclient.sent == [("t", "again")]
