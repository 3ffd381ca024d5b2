"""The Lua scripts as files: how they are put together, and that a server's line number
is said as the file's own."""

from __future__ import annotations

import re
from typing import Any

import pytest

import redlease
from redlease._rules import scripts as _scripts
from redlease._rules.classify import plain
from redlease._rules.flows import acquire_reply
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
    fast_path = next(n for n, line in enumerate(source) if "local mark =" in line)
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
    args = ("t1", "5000", "1", "0", keys.bell_prefix, "1", "", "", "60000")
    with pytest.raises(Exception, match="WRONGTYPE") as raised:
        r.eval(_scripts.ACQUIRE.source, 3, *keys.script_keys, *args)
    line = int(re.findall(r"user_script: ?(\d+)", str(raised.value))[-1])
    file, number = _scripts.ACQUIRE.origin(line) or ("", 0)
    assert file == "acquire"
    assert _scripts.lua_file(file).splitlines()[number - 1].strip() == (
        "holder = redis.call('GET', lock)"
    )


@pytest.mark.parametrize("fair", ["1", "0"])
@pytest.mark.parametrize("held", [False, True])
def test_an_attempt_given_up_takes_nothing_while_others_are_queued(
    r: Any, name: str, fair: str, held: bool
) -> None:
    """The acquire's one EXISTS counts the given-up mark twice and the queue once: with
    both there, the attempt is still over."""
    keys = LockKeys.for_name(name)
    r.set(f"{keys.lock}:mark:gone", "left", px=60_000)
    r.rpush(keys.queue, "other|99999999999999999:30000:0")
    r.pexpire(keys.queue, 60_000)
    if held:
        r.set(keys.lock, "holder", px=60_000)
    args = ("gone", "5000", fair, "30000", keys.bell_prefix, "1", "", "", "60000")
    reply = r.eval(_scripts.ACQUIRE.source, 3, *keys.script_keys, *args)
    assert acquire_reply(reply, 5000)[0] == 0  # nothing granted
    assert r.get(keys.lock) == (b"holder" if held else None)
    assert r.lrange(keys.queue, 0, -1) == [b"other|99999999999999999:30000:0"]  # nor queued


@pytest.mark.parametrize("fair", ["1", "0"])
def test_a_release_of_a_lock_key_of_another_type_says_so(r: Any, name: str, fair: str) -> None:
    keys = LockKeys.for_name(name)
    r.hset(keys.lock, "a", "b")
    r.pexpire(keys.lock, 60_000)
    with pytest.raises(Exception, match="WRONGTYPE"):
        r.eval(_scripts.RELEASE.source, 3, *keys.script_keys, "t1", fair, keys.bell_prefix, "5000")


def test_an_unfair_release_drops_a_woken_mark_whose_waiter_is_gone(r: Any, name: str) -> None:
    keys = LockKeys.for_name(name)
    r.set(keys.lock, "holder", px=60_000)
    r.set(f"{keys.lock}:woken", "gone", px=60_000)  # nobody queued any more
    args = ("holder", "0", keys.bell_prefix, "5000")
    assert r.eval(_scripts.RELEASE.source, 3, *keys.script_keys, *args) == 1
    assert r.exists(keys.lock, f"{keys.lock}:woken") == 0


def _try(r: Any, keys: LockKeys, token: str, place: str, fair: str = "1") -> tuple[int, str]:
    """One acquire of ``token`` that queues for 30 s if it must: (fence, its place)."""
    args = (token, "30000", fair, "30000", keys.bell_prefix, "1", "", place, "60000")
    fence, _pttl, _server_us, place = acquire_reply(
        r.eval(_scripts.ACQUIRE.source, 3, *keys.script_keys, *args), 30_000
    )
    return fence, place


def _line(r: Any, keys: LockKeys) -> list[str]:
    return [item.decode() for item in r.lrange(keys.queue, 0, -1)]


def _queue_reply(r: Any, keys: LockKeys, token: str, place: str = "") -> tuple[int, int, int, str]:
    args = (token, "30000", "1", "30000", keys.bell_prefix, "1", "", place, "60000")
    return acquire_reply(r.eval(_scripts.ACQUIRE.source, 3, *keys.script_keys, *args), 30_000)


def test_a_first_try_behind_others_is_told_the_holders_time_left(r: Any, name: str) -> None:
    """A first try that finds others queued reads the lock's PTTL alone (it cannot hold
    the lock yet): its reply still says how long the holder has, or, when the free lock
    went to the first waiter in this same call, how long that waiter has."""
    keys = LockKeys.for_name(name)
    r.set(keys.lock, "holder", px=20_000)
    assert int(_queue_reply(r, keys, "a")[0]) == 0
    fence, pttl, *_rest = _queue_reply(r, keys, "b")  # a is queued: the lock's PTTL alone
    assert fence == 0
    assert 15_000 < pttl <= 20_000
    r.delete(keys.lock)  # the holder's lease ran out: free, a first in line
    fence, pttl, *_rest = _queue_reply(r, keys, "c")
    assert fence == 0
    assert r.get(keys.lock) == b"a"  # handed to a, and c told a's time (30 s), not "free"
    assert 25_000 < pttl <= 30_000
    assert [item.split("|")[0] for item in _line(r, keys)] == ["b", "c"]


def test_a_key_of_another_type_is_said_before_anyone_queues_behind_it(r: Any, name: str) -> None:
    keys = LockKeys.for_name(name)
    r.hset(keys.lock, "a", "b")
    r.pexpire(keys.lock, 60_000)
    with pytest.raises(Exception, match="WRONGTYPE"):
        _queue_reply(r, keys, "a")
    assert r.exists(keys.queue) == 0
    r.set(keys.lock, "holder", px=60_000)
    _queue_reply(r, keys, "a")
    r.delete(keys.lock)
    r.hset(keys.lock, "a", "b")  # (and one without a TTL, behind a queue, too)
    with pytest.raises(Exception, match="WRONGTYPE"):
        _queue_reply(r, keys, "b")


@pytest.mark.parametrize("fair", ["1", "0"])
def test_a_waiter_keeps_its_place_and_renews_its_entry_where_it_stands(
    r: Any, name: str, fair: str
) -> None:
    """A later try sends the place its last reply gave (or "?" when that reply was lost):
    the script finds it and renews the entry in place; an unfair lock keeps its since."""
    keys = LockKeys.for_name(name)
    r.set(keys.lock, "holder", px=60_000)
    fence, a = _try(r, keys, "a", "", fair)
    assert fence == 0
    assert a.startswith("a|")
    _fence, b = _try(r, keys, "b", "", fair)
    assert _line(r, keys) == [a, b]
    _fence, again = _try(r, keys, "a", a, fair)
    _fence, found = _try(r, keys, "a", "?", fair)
    assert _line(r, keys) == [found, b]  # first still, and queued once
    deadline = [int(p.split("|")[1].split(":")[0]) for p in (a, again, found)]
    assert deadline[0] < deadline[1] < deadline[2]  # each try renews it
    since = [int(p.split(":")[2]) for p in (a, again, found)]
    if fair == "0":
        assert since == [since[0]] * 3  # when it first queued
    else:
        assert since[0] < since[2]  # (read only by an unfair lock)


def test_a_place_no_longer_in_the_queue_queues_at_the_back(r: Any, name: str) -> None:
    keys = LockKeys.for_name(name)
    r.set(keys.lock, "holder", px=60_000)
    _fence, a = _try(r, keys, "a", "")
    _fence, b = _try(r, keys, "b", "")
    r.lrem(keys.queue, 1, a)  # dropped meanwhile (past its deadline, its hub gone)
    _fence, again = _try(r, keys, "a", a)
    assert _line(r, keys) == [b, again]


def test_a_grant_or_a_leave_takes_the_waiters_place_out(r: Any, name: str) -> None:
    """By its place, or by its token when the place is not known ("?"): every item of it
    (queued twice in a way the scripts do not make, say by a version before them)."""
    keys = LockKeys.for_name(name)
    r.set(keys.lock, "holder", px=60_000)
    _fence, a = _try(r, keys, "a", "")
    r.rpush(keys.queue, "a|99999999999999999:30000:0")
    _fence, b = _try(r, keys, "b", "")
    assert _line(r, keys) == [a, "a|99999999999999999:30000:0", b]
    leave = ("a", "1", keys.bell_prefix, "0", "60000", "?")
    assert r.eval(_scripts.LEAVE.source, 3, *keys.script_keys, *leave)[0] == 0
    assert _line(r, keys) == [b]
    r.delete(keys.lock)
    fence, place = _try(r, keys, "b", b)  # first in line: granted, and out of it
    assert fence > 0
    assert place == ""
    assert _line(r, keys) == []


def test_tries_of_one_attempt_landing_in_any_order_queue_it_once(r: Any, name: str) -> None:
    """Nothing orders two connections: a try sent before another may land after it."""
    keys = LockKeys.for_name(name)
    r.set(keys.lock, "holder", px=60_000)
    _fence, other = _try(r, keys, "o", "")
    # a first try, sent twice (its reply lost): the second asks for a search
    _fence, first = _try(r, keys, "a", "?")
    _fence, again = _try(r, keys, "a", "?")
    assert _line(r, keys) == [other, again]
    # a later try lands first and renews the place; the earlier one, with the old place,
    # finds it where it now stands
    _fence, later = _try(r, keys, "a", again)
    _fence, late = _try(r, keys, "a", again)
    assert _line(r, keys) == [other, late]
    assert first != again != later != late


def test_a_first_try_landing_after_a_later_one_queued_anew_finds_its_place(
    r: Any, name: str
) -> None:
    """The first try timed out (not sent again); the next asked for a search, found
    nothing yet and queued; then the first lands: the later one's mark has it search."""
    keys = LockKeys.for_name(name)
    r.set(keys.lock, "holder", px=60_000)
    _fence, other = _try(r, keys, "o", "")
    _fence, searched = _try(r, keys, "a", "?")
    # (as long as a try may still land: longer than the entry, 30 s)
    assert r.get(keys.lock + ":mark:a") == b"requeued"
    assert 30_000 < r.pttl(keys.lock + ":mark:a") <= 60_000
    _fence, first = _try(r, keys, "a", "")
    assert _line(r, keys) == [other, first]
    # one that never searched leaves no mark: a first try costs nothing more
    assert r.exists(keys.lock + ":mark:o") == 0
    assert searched != first


def test_an_attempt_given_up_after_a_search_queued_it_anew_stays_given_up(
    r: Any, name: str
) -> None:
    """The two marks of a token share a key: LEAVE's "left" replaces a search's
    "requeued", and a first try landing late then takes nothing and queues nothing (nor
    does the search's mark come back)."""
    keys = LockKeys.for_name(name)
    r.set(keys.lock, "holder", px=60_000)
    _fence, other = _try(r, keys, "o", "")
    _fence, _searched = _try(r, keys, "a", "?")
    assert r.get(keys.lock + ":mark:a") == b"requeued"
    leave = ("a", "1", keys.bell_prefix, "0", "60000", "?")
    assert r.eval(_scripts.LEAVE.source, 3, *keys.script_keys, *leave)[0] == 0
    assert r.get(keys.lock + ":mark:a") == b"left"
    r.delete(keys.lock)  # free, with o first in line
    assert _try(r, keys, "a", "") == (0, "")  # the late first try
    assert _try(r, keys, "a", "?") == (0, "")
    assert r.get(keys.lock) is None  # (o takes it with its own next try)
    assert _line(r, keys) == [other]
    assert r.get(keys.lock + ":mark:a") == b"left"


@pytest.mark.parametrize("held", [False, True])
def test_a_try_landing_after_its_grant_was_released_and_marked_takes_nothing(
    r: Any, name: str, held: bool
) -> None:
    """A try held up on a dropped connection lands after its attempt's grant was
    released: the LEAVE the release sent after it (its attempt had a try unanswered)
    left the given-up mark, so the try neither takes a free lock nor queues."""
    keys = LockKeys.for_name(name)
    fence, _place = _try(r, keys, "a", "")
    assert fence > 0
    release = ("a", "1", keys.bell_prefix, "5000")
    assert r.eval(_scripts.RELEASE.source, 3, *keys.script_keys, *release) == 1
    leave = ("a", "1", keys.bell_prefix, "0", "60000", "?")
    assert r.eval(_scripts.LEAVE.source, 3, *keys.script_keys, *leave)[0] == 0
    if held:
        r.set(keys.lock, "b", px=60_000)
    fence, place = _try(r, keys, "a", "")  # the late try
    assert fence == 0
    assert place == ""
    assert r.get(keys.lock) == (b"b" if held else None)
    assert _line(r, keys) == []


def test_a_fence_counter_that_is_not_a_number_is_written_over(r: Any, name: str) -> None:
    """A grant reads what the counter held to stay above it: a value that is no number
    (not one of redlease's) does not stop the grant; the clock's fences replace it."""
    keys = LockKeys.for_name(name)
    r.set(keys.fence, "not a number", px=60_000)
    fence, _place = _try(r, keys, "a", "")
    assert fence > 1_000_000_000_000_000  # (above the clock, in microseconds)
    assert int(r.get(keys.fence)) == fence


def test_each_acquire_reply_takes_the_shape_cheapest_for_the_server(r: Any, name: str) -> None:
    """A grant on the fast path is its fence alone and a try that takes nothing one
    string, where a table costs the server a conversion of each field (the uncontended
    cycle's and the queued try's)."""
    keys = LockKeys.for_name(name)
    args = ("a", "30000", "1", "30000", keys.bell_prefix, "1", "", "", "60000")
    granted = r.eval(_scripts.ACQUIRE.source, 3, *keys.script_keys, *args)
    assert isinstance(granted, int)
    assert granted == int(r.get(keys.fence))
    queued = r.eval(_scripts.ACQUIRE.source, 3, *keys.script_keys, "b", *args[1:])
    assert isinstance(queued, bytes)
    _fence, pttl, server_us, place = acquire_reply(queued, 30_000)
    seconds, micros = r.time()
    assert 0 <= seconds * 1_000_000 + micros - server_us < 10_000_000
    assert 25_000 < pttl <= 30_000
    assert _line(r, keys) == [place]


def test_a_key_of_someone_else_s_with_a_ttl_of_ages_is_said_held_not_misread(
    r: Any, name: str
) -> None:
    """A try that takes nothing says the holder's time left in a string: a TTL too long
    for Lua to write exactly (1e14 ms or more) is said as the longest it writes exactly,
    not with an exponent the reader cannot parse."""
    keys = LockKeys.for_name(name)
    r.set(keys.lock, "someone else")
    r.expire(keys.lock, 10**12)  # (a PTTL of 1e15 ms)
    _fence, pttl, _server_us, place = _queue_reply(r, keys, "a")
    assert pttl == 99_999_999_999_999
    assert _line(r, keys) == [place]
    assert redlease.Lock(r, name).try_acquire() is None
