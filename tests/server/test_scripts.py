"""The Lua scripts as files: how they are put together, and that a server's line number
is said as the file's own."""

from __future__ import annotations

import re
from typing import Any

import pytest

from redlease._rules import scripts as _scripts
from redlease._rules.classify import plain
from redlease._rules.keys import LockKeys

EVERY = [v for v in vars(_scripts).values() if isinstance(v, _scripts.Script)]


@pytest.mark.parametrize("script", EVERY, ids=lambda s: s.name)
def test_each_line_the_server_runs_remembers_its_file_and_line(script: _scripts.Script) -> None:
    sent = script.source.splitlines()
    assert len(script.origins) == len(sent)
    for number, text in enumerate(sent, 1):
        origin = script.origin(number)
        assert origin is not None
        file, line = origin
        assert _scripts.lua_file(file).splitlines()[line - 1] == text
    # the script's own file, whole and in order
    own = [
        text for text, (file, _) in zip(sent, script.origins, strict=True) if file == script.name
    ]
    written = _scripts.lua_file(script.name).splitlines()
    assert own == written
    # (the contract first: its keys, arguments and reply)
    header = " ".join(line for line in written if line.startswith("--"))
    assert "KEYS" in header
    assert "Reply" in header
    assert script.origin(len(sent) + 1) is None


def test_a_file_included_twice_is_there_once_where_first_included() -> None:
    # acquire includes fences, then lock, which includes fences again
    assert "--@include fences" in _scripts.lua_file("lock")
    source = _scripts.ACQUIRE.source.splitlines()
    assert sum("local function take_fences(" in line for line in source) == 1
    defined = next(n for n, line in enumerate(source) if "local function take_fences(" in line)
    fast_path = next(n for n, line in enumerate(source) if "given_up =" in line)
    assert defined < fast_path
    assert sum(line == "--@include fences" for line in source) == 2  # (the second: nothing)


def test_a_server_s_place_in_a_script_is_said_as_the_file_s_line() -> None:
    script = _scripts.ACQUIRE
    at = next(n for n, (file, _) in enumerate(script.origins, 1) if file == "fences")
    line = script.origins[at - 1][1]
    told = f"ERR user_script:{at}: boom script: {script.sha}, on @user_script:{at}."
    assert plain(told) == f"ERR fences.lua:{line}: boom"
    # Redis 6.2's wording
    told = f"ERR Error running script (call to f_{script.sha}): @user_script:{at}: "
    assert plain(told + f"user_script:{at}: boom") == f"fences.lua:{line}: boom"
    # a script that is not redlease's keeps the server's words
    assert plain(f"ERR user_script:3: boom script: {'0' * 40}, on @user_script:3.") == (
        "ERR user_script:3: boom"
    )


def test_the_constants_are_the_packages() -> None:
    line = _scripts.lua_file("constants")
    names, values = line.removeprefix("local ").split(" = ")
    assert dict(zip(names.split(", "), map(int, values.split(", ")), strict=True)) == (
        _scripts.CONSTANTS
    )
    assert "FENCE_LEAD_US" in _scripts.lua_file("fences")


def test_an_error_in_a_script_names_its_files_line(r: Any, name: str) -> None:
    """acquire.lua reads the lock after two lines of includes: the server's line number
    of a WRONGTYPE there is the file's."""
    keys = LockKeys.for_name(name)
    r.hset(keys.lock, "a", "b")
    r.pexpire(keys.lock, 60_000)
    args = ("t1", "5000", "1", "0", keys.bell_prefix, "1", "")
    with pytest.raises(Exception, match="WRONGTYPE") as raised:
        r.eval(_scripts.ACQUIRE.source, 4, *keys.script_keys, *args)
    line = int(re.findall(r"user_script: ?(\d+)", str(raised.value))[-1])
    file, number = _scripts.ACQUIRE.origin(line) or ("", 0)
    assert file == "acquire"
    assert _scripts.lua_file(file).splitlines()[number - 1].strip() == (
        "local holder = redis.call('GET', lock)"
    )
