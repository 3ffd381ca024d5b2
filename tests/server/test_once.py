"""Scheduled jobs that run once across the fleet (``redlease.once``, ``Once``,
``AsyncOnce``) on real Redis and Valkey servers, sync and asyncio: a call while the name
is held is skipped at once, in one round trip; ``at_least`` keeps the name by the
server's clock after the job, even past the process's exit; ``at_most`` frees it after a
node dies mid-job; ``every`` makes one run per period of the server's clock."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

import redlease
from families import ClientFamily
from redlease._rules.flows import acquire_reply
from redlease._rules.keys import LockKeys
from redlease._rules.scripts import ONCE_ACQUIRE, ONCE_EXTEND, ONCE_LEAVE
from redlease.tools import servers
from redlease.tools.chaos.proxy import FaultProxy
from waiting_helpers import script_calls, wait_until

LOCK = "redlease:{%s}"


def server_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def scripts_run(r: redis.Redis) -> int:
    """Scripts the server has run (the commands they call are counted apart)."""
    return script_calls(r.info("commandstats"))


def test_a_call_while_a_run_holds_the_name_is_skipped_in_one_round_trip(
    twin: Any, r: redis.Redis, name: str
) -> None:
    job = twin.once(name, at_most=30)
    run = job.begin()
    assert run
    assert run.fence > 0
    assert not run.lost
    other = twin.once(name, at_most=30)
    other.begin()  # (its first call looks at the server's settings once)
    before = scripts_run(r)
    skipped = other.begin()
    assert scripts_run(r) - before == 1
    assert isinstance(skipped, redlease.Skipped)
    assert not skipped
    assert (skipped.name, skipped.reason) == (name, "running")
    assert skipped.retry_in is not None
    assert 25 < skipped.retry_in <= 30
    run.release()
    assert not job.locked()
    again = other.begin()
    assert again
    assert again.fence > run.fence
    again.release()


def test_the_decorated_job_runs_or_returns_skipped_without_running(
    twin: Any, r: redis.Redis, name: str
) -> None:
    calls: list[tuple[int, int]] = []

    def report(x: int, *, fence: int) -> int:
        calls.append((x, fence))
        return x * 2

    job = twin.once(name, at_most=30, fence_as="fence")(report)

    assert job(21) == 42
    assert len(calls) == 1
    assert calls[0][1] > 0
    assert not r.exists(LOCK % name)  # released at its end (no at_least)
    holder = twin.once(name, at_most=30).begin()
    skipped = job(5)
    assert isinstance(skipped, redlease.Skipped)
    assert skipped.reason == "running"
    assert len(calls) == 1  # not run
    holder.release()
    assert job(1) == 2
    assert calls[-1][1] > calls[0][1]


def test_at_least_keeps_the_name_after_a_short_job_by_the_servers_clock(
    twin: Any, r: redis.Redis, name: str
) -> None:
    job = twin.once(name, at_most=30, at_least=1.5)
    start = server_ms(r)
    run = job.begin()
    run.release()  # after a few ms
    left = r.pttl(LOCK % name)
    assert 0 < left <= 1500
    assert start + 1500 - 100 <= server_ms(r) + left <= start + 1500 + 100
    skipped = twin.once(name, at_most=30).begin()
    assert isinstance(skipped, redlease.Skipped)
    assert skipped.reason == "running"
    time.sleep(left / 1000 + 0.05)
    later = job.begin()
    assert later
    later.release()


def test_a_renewal_that_lands_after_the_release_keeps_at_least(r: redis.Redis, name: str) -> None:
    """The renewer's extend and the run's release race (two connections): an extend
    that reaches the server after the release kept the name for at_least must not cut
    that time down to the lease's ttl."""
    job = redlease.once(r, name, at_most=60, ttl=0.3, at_least=30)
    run = job.begin()
    assert run
    token = r.get(LOCK % name)
    assert token is not None
    run.release()  # kept for at_least: about 30 s
    at_most_end = server_ms(r) + 60_000
    assert r.eval(ONCE_EXTEND.source, 1, LOCK % name, token, 300, at_most_end) > 25_000
    assert r.pttl(LOCK % name) > 25_000


def test_a_skip_after_the_periods_run_says_when_the_name_is_free(r: redis.Redis, name: str) -> None:
    """retry_in is when a call may run: the next period, or later if the name is held
    past it (here at_least outlasts the period)."""
    job = redlease.once(r, name, at_most=20, at_least=10, every=2)
    run = job.begin()
    assert run
    run.release()
    skipped = job.begin()
    assert isinstance(skipped, redlease.Skipped)
    assert skipped.reason in ("ran this period", "running")  # (a period may have begun)
    assert skipped.retry_in is not None
    assert skipped.retry_in > 8


def test_a_job_longer_than_at_least_frees_the_name_at_its_end(
    twin: Any, r: redis.Redis, name: str
) -> None:
    job = twin.once(name, at_most=30, at_least=0.2)
    run = job.begin()
    time.sleep(0.3)
    run.release()
    assert not r.exists(LOCK % name)


def _script(port: int, body: str) -> str:
    return textwrap.dedent(
        f"""
        import sys, time, redis, redlease
        r = redis.Redis(port={port})
        """
    ) + textwrap.dedent(body)


def test_at_least_holds_after_the_process_has_exited(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    code = _script(
        server.port,
        f"""
        @redlease.once(r, {name!r}, at_most=60, at_least=3)
        def job():
            return "ran"
        print(job())
        """,
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ran", done.stderr
    assert r.pttl(LOCK % name) > 1000  # the process is gone; the server keeps the name
    skipped = redlease.Once(r, name, at_most=60).begin()
    assert isinstance(skipped, redlease.Skipped)


def test_a_node_killed_mid_job_frees_the_name_after_at_most(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    code = _script(
        server.port,
        f"""
        with redlease.once(r, {name!r}, at_most=1.5) as run:
            print(run.fence, flush=True)
            time.sleep(60)
        """,
    )
    node = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert node.stdout is not None
        assert int(node.stdout.readline()) > 0
        node.send_signal(signal.SIGKILL)
        node.wait(timeout=10)
        job = redlease.Once(r, name, at_most=60)
        assert isinstance(job.begin(), redlease.Skipped)
        left = r.pttl(LOCK % name)
        assert 0 < left <= 1500
        time.sleep(left / 1000 + 0.05)
        run = job.begin()
        assert run
        run.release()
    finally:
        node.kill()
        node.wait(timeout=10)
        if node.stdout is not None:
            node.stdout.close()


def test_every_makes_one_run_per_period_of_the_servers_clock(
    twin: Any, r: redis.Redis, name: str
) -> None:
    period_ms = 400
    # Each run's period, bracketed by the server's clock: read before the try (the grant
    # is made after it) and in the run (after the grant). Where both fall in one period,
    # that is the grant's; a run late on a loaded machine may straddle two.
    before: list[int] = []
    runs: list[tuple[int, int, bytes | None, int]] = []

    def hourly() -> None:
        key = LOCK % name + ":once"  # (written by the grant, kept until the period ends)
        record, left = r.get(key), r.pttl(key)
        runs.append((before[-1], server_ms(r) // period_ms, record, left))  # type: ignore[arg-type]

    job = twin.once(name, at_most=5, every=period_ms / 1000)(hourly)

    skips = 0
    until = time.monotonic() + 2.2
    while time.monotonic() < until:
        before.append(server_ms(r) // period_ms)
        if isinstance(job(), redlease.Skipped):
            skips += 1
        time.sleep(0.02)
    assert len(runs) >= 4  # (a run in most of the 5 periods tried: none is held back)
    assert skips > len(runs)
    exact = [start for start, end, _, _ in runs if start == end]
    assert len(exact) >= len(runs) // 2  # (most runs start and run in one period)
    assert len(exact) == len(set(exact))  # never two in one period
    starts = [start for start, _, _, _ in runs]
    ends = [end for _, end, _, _ in runs]
    for earlier, later in zip(ends, starts[1:], strict=False):
        assert later >= earlier  # each run in a later period than the one before
    for start, end, record, left in runs:
        if start == end:  # the run's own period: its record names it
            assert record is not None
            assert int(record.split(b":")[0]) == start  # "period:token"
            assert 0 < left <= period_ms


def test_a_period_that_has_run_says_when_the_next_one_begins(
    twin: Any, r: redis.Redis, name: str
) -> None:
    job = twin.once(name, at_most=5, every=3600)
    run = job.begin()
    run.release()
    skipped = job.begin()
    assert isinstance(skipped, redlease.Skipped)
    assert skipped.reason == "ran this period"
    next_period = (server_ms(r) // 3_600_000 + 1) * 3_600_000
    assert skipped.retry_in is not None
    assert abs(server_ms(r) + skipped.retry_in * 1000 - next_period) < 200


def test_a_run_that_fails_still_counts_for_its_period(twin: Any, r: redis.Redis, name: str) -> None:
    def failing() -> None:
        raise RuntimeError("the job failed")

    job = twin.once(name, at_most=5, every=3600)(failing)

    with pytest.raises(RuntimeError, match="the job failed"):
        job()
    assert not r.exists(LOCK % name)  # released
    skipped = job()
    assert isinstance(skipped, redlease.Skipped)
    assert skipped.reason == "ran this period"


def test_a_renewed_lease_is_never_kept_past_at_most(twin: Any, r: redis.Redis, name: str) -> None:
    job = twin.once(name, at_most=1.2, ttl=0.3)
    start = server_ms(r)
    run = job.begin()
    granted_by = server_ms(r)  # (at_most counts from the grant: between these two)
    ends = []
    while run.remaining() > 0:
        left = r.pttl(LOCK % name)
        if left > 0:
            assert left <= 300
            ends.append(server_ms(r) + left)
        time.sleep(0.02)
    assert ends
    assert max(ends) <= granted_by + 1200 + 50
    assert max(ends) >= start + 900  # it was renewed
    assert run.lost
    assert run.lost_reason == "its at_most time is over"


def test_on_lost_is_told_once_at_most_has_passed_while_the_job_runs(twin: Any, name: str) -> None:
    told: list[str | None] = []
    job = twin.once(name, at_most=0.5, on_lost=lambda run: told.append(run.lost_reason))
    run = job.begin()
    wait_until(lambda: bool(told), 10)  # the job still runs: nobody looked at the lease
    assert told == ["its at_most time is over"]
    assert run.lost


def test_a_run_given_back_before_its_job_frees_the_name_and_the_period(
    twin: Any, r: redis.Redis, name: str
) -> None:
    job = twin.once(name, at_most=30, at_least=10, every=3600)
    run = job.begin()
    run.abandon()  # no at_least: the job never began
    assert not r.exists(LOCK % name, LOCK % name + ":once")
    assert run.released
    again = job.begin()
    assert again
    again.release()
    assert isinstance(job.begin(), redlease.Skipped)  # this one counted


def test_extend_never_goes_past_at_most(twin: Any, r: redis.Redis, name: str) -> None:
    job = twin.once(name, at_most=2)
    run = job.begin()
    run.extend(100)
    assert 1500 < r.pttl(LOCK % name) <= 2000
    assert run.remaining() <= 2
    run.release()


def test_a_lock_of_the_same_name_is_kept_out_by_a_run_and_its_at_least(
    twin: Any, name: str
) -> None:
    job = twin.once(name, at_most=30, at_least=1)
    lock = twin.lock(name)
    run = job.begin()
    assert lock.try_acquire() is None
    run.release()
    assert lock.try_acquire() is None
    lease = lock.acquire(timeout=5)  # woken once at_least has passed
    assert isinstance(job.begin(), redlease.Skipped)
    lease.release()


def test_the_context_manager_gives_the_run_or_the_skip(r: redis.Redis, name: str) -> None:
    job = redlease.once(r, name, at_most=30)
    assert isinstance(job, redlease.Once)
    with job as run:
        assert isinstance(run, redlease.Run)
        assert run
        with job as inner:
            assert isinstance(inner, redlease.Skipped)
        assert job.locked()
    assert not job.locked()


async def test_the_asyncio_context_manager_and_decorator(
    server: servers.ServerProcess, family: ClientFamily, name: str
) -> None:
    client: aredis.Redis = family.aclient(port=server.port)
    try:
        job = redlease.once(client, name, at_most=30, at_least=0.3)
        assert isinstance(job, redlease.AsyncOnce)
        async with job as run:
            assert isinstance(run, redlease.AsyncRun)
            async with job as inner:
                assert not inner
        assert await job.locked()  # its at_least

        @redlease.once(client, name + ":deco", at_most=30)
        async def nightly() -> str:
            await asyncio.sleep(0.2)
            return "done"

        results = await asyncio.gather(*(nightly() for _ in range(20)))
        assert results.count("done") == 1
        assert all(isinstance(x, redlease.Skipped) for x in results if x != "done")
    finally:
        await client.aclose()


def test_a_skip_is_logged(r: redis.Redis, name: str, caplog: pytest.LogCaptureFixture) -> None:
    job = redlease.Once(r, name, at_most=30)
    with job, caplog.at_level(logging.INFO, logger="redlease"):
        job.begin()
    assert f"scheduled job {name!r} skipped: running" in caplog.text


def test_a_forked_child_skips_and_never_hangs(r: redis.Redis, name: str) -> None:
    job = redlease.Once(r, name, at_most=30)
    with job as run:
        assert run
        pid = os.fork()
        if pid == 0:  # the child: the parent's run is not its own
            try:
                skipped = job.begin()
                os._exit(0 if isinstance(skipped, redlease.Skipped) and run.lost else 1)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    assert not r.exists(LOCK % name)


def test_a_server_that_closes_idle_clients_is_no_bother(r: redis.Redis, name: str) -> None:
    job = redlease.Once(r, name, at_most=30)
    first = job.begin()
    assert isinstance(first, redlease.Run)
    first.release()
    old = str(r.config_get("timeout")["timeout"])
    r.config_set("timeout", 1)
    try:
        time.sleep(2.2)  # the job's connection is closed by the server meanwhile
        run = job.begin()
        assert run
        run.release()
    finally:
        r.config_set("timeout", old)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"at_most": 1, "at_least": 2}, "at_least"),
        ({"at_most": 5, "ttl": 10}, "ttl"),
        ({"at_most": 5, "at_least": -1}, "at_least"),
        ({"at_most": 0}, "at_most"),
        ({"at_most": 5, "every": 0}, "every"),
        ({"at_most": 5, "every": "1h"}, "every"),
        ({"at_most": 5, "fence_as": "not a name"}, "fence_as"),
        ({"at_most": 5, "on_lost": 3}, "on_lost"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    r: redis.Redis, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(redlease.InvalidArgument, match=named):
        redlease.Once(r, "job", **options)


def test_the_wrong_flavour_of_client_is_refused(r: redis.Redis) -> None:
    with pytest.raises(redlease.InvalidArgument, match="AsyncOnce"):
        redlease.AsyncOnce(r, "job", at_most=5)

    async def decorate_a_plain_function() -> None:
        client = aredis.Redis()
        with pytest.raises(redlease.InvalidArgument, match="async def"):
            redlease.AsyncOnce(client, "job", at_most=5)(lambda: None)  # type: ignore[arg-type, return-value]
        await client.aclose()

    asyncio.run(decorate_a_plain_function())
    with pytest.raises(redlease.InvalidArgument, match="coroutine function"):

        @redlease.Once(r, "job", at_most=5)
        async def job() -> None: ...


def _acquire_args(name: str, token: str, period_ms: int) -> list[Any]:
    keys = LockKeys.for_name(name)
    return [
        *keys.script_keys,
        keys.once,
        token,
        "30000",
        "1",
        "0",
        keys.bell_prefix,
        "1",
        "",
        "",
        "60000",
        str(period_ms),
    ]


def test_a_try_sent_again_after_its_reply_was_lost_finds_its_own_grant(
    r: redis.Redis, name: str
) -> None:
    token = "ab" * 16
    first = r.eval(ONCE_ACQUIRE.source, 4, *_acquire_args(name, token, 3_600_000))
    again = r.eval(ONCE_ACQUIRE.source, 4, *_acquire_args(name, token, 3_600_000))
    assert int(first[0]) > 0
    assert int(again[0]) == int(first[0])  # its grant, not "ran this period"
    other = r.eval(ONCE_ACQUIRE.source, 4, *_acquire_args(name, "cd" * 16, 3_600_000))
    assert int(other[0]) == -1


def test_a_try_given_up_before_its_run_does_not_use_up_its_period(
    r: redis.Redis, name: str
) -> None:
    token = "ab" * 16
    assert int(r.eval(ONCE_ACQUIRE.source, 4, *_acquire_args(name, token, 3_600_000))[0]) > 0
    keys = LockKeys.for_name(name)
    leave = (token, "1", keys.bell_prefix, "0", "60000", "")
    r.eval(ONCE_LEAVE.source, 4, *keys.script_keys, keys.once, *leave)
    assert not r.exists(keys.lock, keys.once)
    # the same try arriving again after its clean-up (in flight on a dropped connection)
    # takes neither the name nor the period
    late = r.eval(ONCE_ACQUIRE.source, 4, *_acquire_args(name, token, 3_600_000))
    assert isinstance(late, bytes)  # (nothing granted: the acquire's string)
    assert acquire_reply(late, 30_000)[0] == 0
    assert not r.exists(keys.lock, keys.once)
    run = redlease.Once(r, name, at_most=30, every=3600).begin()
    assert isinstance(run, redlease.Run)
    run.release()


def test_fence_as_is_checked_when_decorating_and_never_overwritten(
    r: redis.Redis, name: str
) -> None:
    job = redlease.Once(r, name, at_most=30, fence_as="fence")
    with pytest.raises(redlease.InvalidArgument, match="fence_as"):
        job(lambda: None)

    def work(item: int, fence: int = 0) -> int:
        return fence

    decorated = job(work)
    assert list(inspect.signature(decorated).parameters) == ["item"]
    with pytest.raises(TypeError, match="fence_as"):
        decorated(1, fence=123)
    assert not r.exists(LOCK % name)  # refused before the name was taken
    with pytest.raises(TypeError, match="cannot be called so: too many positional"):
        decorated(1, 123)  # the fence given by position
    with pytest.raises(TypeError, match="cannot be called so"):
        decorated()  # type: ignore[call-arg]  # (a call the job cannot take)
    assert not r.exists(LOCK % name)
    fence = decorated(1)
    assert isinstance(fence, int)
    assert fence > 0


def test_parameters_after_the_fence_are_shown_and_taken_by_keyword(
    r: redis.Redis, name: str
) -> None:
    """The fence goes by keyword, so a parameter after it cannot be given by position
    (it would reach the fence's place): the decorated job shows it keyword-only."""
    job = redlease.Once(r, name, at_most=30, fence_as="fence")

    def work(fence: int, item: int, more: int = 2) -> tuple[int, int]:
        return item, more

    decorated = job(work)
    shown = inspect.signature(decorated)
    assert [(p.name, p.kind) for p in shown.parameters.values()] == [
        ("item", inspect.Parameter.KEYWORD_ONLY),
        ("more", inspect.Parameter.KEYWORD_ONLY),
    ]
    with pytest.raises(TypeError, match="cannot be called so"):
        decorated(1)  # type: ignore[call-arg]  # (the typed signature is work's own)
    assert not r.exists(LOCK % name)
    assert decorated(item=1) == (1, 2)  # type: ignore[call-arg]

    def spread(fence: int, *items: int) -> None:
        pass

    with pytest.raises(redlease.InvalidArgument, match=r"before \*items"):
        redlease.Once(r, name + ":2", at_most=30, fence_as="fence")(spread)


# -- production conditions: the job's connections killed, the server restarted, a slow
# link (the driver is the lock's; these pin that a job's run and skip go through it)


def test_a_run_survives_its_connections_being_killed(r: redis.Redis, name: str) -> None:
    job = redlease.Once(r, name, at_most=30, at_least=5)
    run = job.begin()
    assert isinstance(run, redlease.Run)
    admin: Any = redis.Redis(port=r.connection_pool.connection_kwargs["port"])
    assert admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") >= 1
    admin.close()
    run.release()  # on a new connection: at_least kept
    assert 0 < r.pttl(LOCK % name) <= 5000
    assert isinstance(job.begin(), redlease.Skipped)


@pytest.mark.parametrize("kept", [True, False], ids=["with-data", "without-data"])
def test_a_restart_keeps_at_least_and_the_period_only_with_the_data(
    binary: servers.ServerBinary, name: str, kept: bool
) -> None:
    """With the data (an append-only file), a restart keeps the name held for at_least
    and the period run; without it, both are forgotten and the job may run again (the
    documented limit)."""
    with servers.ServerProcess(binary, appendfsync_always=kept) as proc:
        client = redis.Redis(port=proc.port)
        job = redlease.Once(client, name, at_most=30, at_least=20, every=3600)
        run = job.begin()
        assert isinstance(run, redlease.Run)
        run.release()
        proc.restart()
        again = job.begin()
        if kept:
            assert isinstance(again, redlease.Skipped)
            assert 0 < client.pttl(LOCK % name) <= 20_000
        else:
            assert isinstance(again, redlease.Run)
            again.release()
        client.close()


def test_a_slow_link_still_skips_in_one_try_and_runs(
    server: servers.ServerProcess, name: str
) -> None:
    with FaultProxy("127.0.0.1", server.port).start() as proxy:
        proxy.set_mode("delay", delay_ms=100)
        client = redis.Redis(port=proxy.port)
        job = redlease.Once(client, name, at_most=30, at_least=5)
        run = job.begin()
        assert isinstance(run, redlease.Run)
        started = time.monotonic()
        skipped = redlease.Once(client, name, at_most=30).begin()
        took = time.monotonic() - started
        assert isinstance(skipped, redlease.Skipped)
        assert took < 2.0  # a try's bound, whatever the link
        run.release()
        assert client.pttl(LOCK % name) > 0  # at_least kept through the slow link
        client.close()
