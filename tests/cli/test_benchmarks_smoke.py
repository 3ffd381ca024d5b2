"""The benchmarks run end to end in a tiny mode and produce well-formed figures.

Structure only (rates positive, nothing lost): no speed thresholds, which would make the
tests depend on the machine.
"""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# benchmarks/ lives beside src/ and is not installed: `pytest` alone does not put the
# repository root on sys.path (`python -m pytest` does). Spawned workers inherit it.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks import (  # noqa: E402
    burst,
    connections,
    contention,
    gates,
    handoff,
    idle,
    instructions,
    memory,
    primitives,
    renewal,
    scheduled,
    share,
    uncontended,
    waiters,
)
from benchmarks._common import TINY, Crew  # noqa: E402
from benchmarks._locks import KINDS  # noqa: E402
from benchmarks._pairs import Pair, alternated, rows  # noqa: E402
from benchmarks._report import FAIL, NA, Report, Row  # noqa: E402

from redlease.tools import servers  # noqa: E402

# aioredlock's client library (aioredis 1.x) still uses distutils' version classes.
pytestmark = pytest.mark.filterwarnings(
    "ignore:distutils Version classes are deprecated:DeprecationWarning"
)


@pytest.fixture(scope="module")
def server() -> Iterator[servers.ServerProcess]:
    """The benchmarks' own workings do not depend on the server's kind: they run on one,
    Valkey's (always here), not on each kind of the session."""
    with servers.running(1, kind="valkey") as fresh:
        yield fresh[0]


@pytest.fixture(scope="module")
def crew() -> Iterator[Crew]:
    with Crew(TINY.processes) as made:
        yield made


def measured(rows: list[Row], figure: str) -> list[Row]:
    found = [r for r in rows if r.figure.startswith(figure)]
    assert found, f"no {figure!r} rows"
    return found


def assert_no_errors(rows: list[Row]) -> None:
    errors = [(r.contender, r.shown) for r in rows if r.shown.startswith("error")]
    assert errors == []


def test_uncontended_cycles_of_every_contender(server: servers.ServerProcess) -> None:
    with servers.running(2, kind=server.binary.kind) as others:
        nodes = [uncontended.Node(p.port) for p in (server, *others)]
        rows = uncontended.run(nodes, TINY, masters=(3,))
    assert_no_errors(rows)
    for row in measured(rows, "cycles/s"):
        assert row.shown.startswith(NA) or (row.value is not None and row.value > 0), row


def test_uncontended_report_renders(server: servers.ServerProcess) -> None:
    rows = uncontended.run([uncontended.Node(server.port)], TINY, redlock=False)
    report = Report(
        meta=dict.fromkeys(
            ("date", "mode", "server", "cores", "platform", "python", "redis_py", "command"), "x"
        )
    )
    report.add_all(rows)
    text, markdown = report.text(), report.markdown()
    assert "redlease Lock" in text
    assert "| floor: redis-py SET NX PX + EVALSHA |" in markdown
    assert set(report.as_json()) == {"meta", "disclaimer", "rows", "notes", "tally"}


def test_contention_loses_no_update(server: servers.ServerProcess, crew: Crew) -> None:
    tallies = contention.measure(crew, server.binary.kind, TINY)
    for tally in tallies:
        assert tally.problem is None, tally.problem
        assert tally.sections > 0
        assert all(r > 0 for r in tally.rates)
        assert len(tally.processes) == TINY.processes
        assert 0 < tally.fairness[0] <= 1
        assert min(tally.waits) >= 0
    assert {t.kind: t.lost for t in tallies}["redlease"] == 0
    assert {t.kind for t in tallies if t.alone} == set(contention.ALONE)
    rows = contention.rows(tallies, TINY.processes)
    assert len([r for r in rows if r.figure.startswith("sections/s of 1 process alone")]) == 2
    assert [r.verdict for r in rows if r.figure == "lost updates"].count(FAIL) == 0


def test_the_servers_share_is_counted_for_every_lock(
    server: servers.ServerProcess, crew: Crew
) -> None:
    tallies = share.measure(crew, server.binary.kind, TINY)
    for tally in tallies:
        assert tally.problem is None, tally.problem
        assert tally.cycle_cpu[0] > 0
        assert tally.section_cpu[0] > 0
        # a cycle reaches the server: at least an acquire and a release
        assert tally.cycle_commands[0] >= 2
        assert tally.section_commands[0] >= 4  # (and the counter's GET and SET)
    rows = share.rows(tallies, TINY)
    assert_no_errors(rows)
    assert {r.contender for r in rows} == {KINDS[k] for k in share.SHARE}
    assert len([r for r in rows if r.verdict]) == 2 * len(share.BARS)


def test_the_servers_share_compares_round_by_round() -> None:
    # A round where the machine was slow for both weighs as one like any other: the
    # ratio is the rounds' median ratio, not a ratio of medians taken rounds apart.
    def tally(kind: str, cpus: list[float]) -> share.Tally:
        return share.Tally(kind, cpus, [4.0] * 3, cpus, [4.0] * 3)

    tallies = [tally("redis-py", [1.0, 10.0, 1.0]), tally("redlease", [1.0, 10.0, 3.0])]
    got = {r.figure: r for r in share.rows(tallies, TINY) if r.contender == KINDS["redlease"]}
    cycle = got["server CPU per uncontended cycle"]
    assert cycle.ratio == "1.00x redis-py"  # (medians apart: 3.00x)
    assert cycle.extra["rounds_ratio"] == [1.0, 1.0, 3.0]
    # the reference failed: every other lock's figures are still shown, without a ratio
    failed = share.Tally("redis-py", [], [], [], [], problem="error: ConnectionError")
    rows = share.rows([failed, tally("redlease", [1.0, 10.0, 3.0])], TINY)
    cycle = next(r for r in rows if r.figure == "server CPU per uncontended cycle" and r.value)
    assert cycle.ratio == "nanx redis-py"
    assert cycle.extra["rounds_ratio"] == []


def test_a_burst_is_timed_against_a_bounded_pool(server: servers.ServerProcess) -> None:
    rows = burst.run(server.port, TINY)
    assert_no_errors(rows)
    queued = measured(rows, f"{TINY.burst_tasks:,} waiters")[0]
    assert queued.value is not None
    assert queued.value > 0
    assert measured(rows, "commands sent")[0].value == 0  # waiting costs the server nothing
    assert measured(rows, f"{TINY.burst_tasks:,} tasks, two EVALSHAs")[0].value


def test_handoff_latencies(server: servers.ServerProcess, crew: Crew) -> None:
    tallies = handoff.measure(crew, server.port, TINY)
    for tally in tallies:
        assert tally.problem is None, tally.problem
        assert len(tally.latencies) == TINY.handoff_reps
        assert all(latency > 0 for latency in tally.latencies)
    assert_no_errors(handoff.rows(tallies))


def test_idle_waiter_commands(server: servers.ServerProcess, crew: Crew) -> None:
    tallies = idle.measure(crew, server.port, TINY)
    for tally in tallies:
        assert tally.problem is None, tally.problem
        assert tally.per_waiter >= 0
    by_kind = {t.kind: t for t in tallies}
    assert by_kind["redis-py"].per_waiter > 0  # it polls


def test_renewal_figures(server: servers.ServerProcess) -> None:
    tallies = renewal.measure(server.port, TINY, fresh_process=False)
    for tally in tallies:
        if tally.kind == "redlease" and tally.problem and tally.problem.startswith(NA):
            continue  # auto-renewal not available yet
        assert tally.problem is None, tally.problem
        got = tally.result
        assert got["still_held"] == got["count"]
        assert got["cpu_share"] >= 0
        assert not math.isnan(got["round_trips_per_s"])
    assert_no_errors(renewal.rows(tallies, TINY))


def test_connections_per_timed_out_acquire(server: servers.ServerProcess) -> None:
    rows = connections.run(server.port, TINY)
    assert_no_errors(rows)
    assert [row.value is not None and row.value >= 0 for row in rows] == [True, True]


def test_connections_held_by_blocked_waiters(server: servers.ServerProcess) -> None:
    rows = waiters.run(server.port, TINY)
    assert_no_errors(rows)
    assert len(rows) == 3  # redlease tasks and threads, python-redis-lock threads
    assert all(row.value is not None and row.value >= 1 for row in rows)


def test_memory_kept_for_names(server: servers.ServerProcess) -> None:
    tally = memory.measure(server.binary.kind, TINY)
    assert tally.problem is None, tally.problem
    assert tally.baseline is not None
    assert tally.at_once is not None
    assert tally.at_once.keys > 0  # names were taken
    assert tally.final is not None
    assert tally.final.at >= tally.last_release
    rows = memory.rows(tally, TINY)
    assert_no_errors(rows)
    assert len(rows) == 5  # baseline, at once, at the bound, after it, DBSIZE 0


def test_primitives_sections_run(server: servers.ServerProcess, crew: Crew) -> None:
    rows = primitives.run(crew, server.port, TINY)
    assert_no_errors(rows)
    assert measured(rows, "sections/s")[0].value > 0  # type: ignore[operator]
    assert measured(rows, "read sections/s")[0].value > 0  # type: ignore[operator]
    resign = measured(rows, "new leader after resign()")[0]
    assert resign.value is not None
    assert resign.value > 0
    killed = measured(rows, "new leader after the leader is killed")[0]
    assert killed.value is not None
    assert killed.value > 0


def test_the_fence_gates_cost_is_measured(server: servers.ServerProcess) -> None:
    rows = gates.run(server.port, TINY)
    assert_no_errors(rows)
    # SQLite: the table gate and fenced_update; PostgreSQL: gated_execute, the table gate
    # (a reference there), fenced_update and SELECT 1; Redis: FencedRedis. Each both ways.
    assert len(measured(rows, "writes/s")) == 14
    costs = measured(rows, "time, gated / ungated")
    assert len(costs) == 6
    for row in costs:
        assert row.value is not None, row
        assert row.value > 0, row
    assert [row.contender for row in costs if not row.bar] == [
        "PostgreSQL (psycopg 3, loopback), one-row UPDATE + COMMIT, fence_gate first "
        "(a statement of its own; reference)"
    ]
    # gated_execute's CPU at both ends, either way, and their ratio (no bar)
    assert len(measured(rows, "us CPU: server + client")) == 2
    (cpu,) = measured(rows, "CPU, gated / ungated")
    assert cpu.value is not None
    assert cpu.value > 0
    assert not cpu.bar
    (reference,) = measured(rows, "time, with SELECT 1 / the transaction")
    assert reference.value is not None
    assert reference.value > 0
    assert not reference.bar
    assert not reference.verdict


def test_a_pair_takes_turns_cycle_by_cycle() -> None:
    """Both sides of a cost run under the same machine state: one cycle each, in turn."""
    calls: list[str] = []
    pair = Pair("turns", lambda: calls.append("plain"), lambda: calls.append("gated"), None)
    plain, gated = alternated(pair, 0.01)
    assert calls[:4] == ["plain", "gated", "gated", "plain"]
    assert calls.count("plain") == calls.count("gated")
    assert plain > 0
    assert gated > 0


def test_the_scheduled_jobs_cost_is_measured(server: servers.ServerProcess) -> None:
    rows = scheduled.run(server.port, TINY)
    assert_no_errors(rows)
    assert len(measured(rows, "calls/s")) == 4  # two skips, each with its busy try
    assert len(measured(rows, "cycles/s")) == 2
    for row in measured(rows, "time, once / Lock"):
        assert row.value is not None, row
        assert row.value > 0, row


def test_a_pairs_cost_is_the_median_of_its_rounds_ratios() -> None:
    """Each round's ratio compares two sides measured on the same machine; the figure is
    their median, not the ratio of medians taken from different rounds."""
    pair = Pair("rounds", lambda: None, lambda: None, 1.5)
    pair.rates = {"plain": [100.0, 10.0, 100.0], "gated": [50.0, 10.0, 100.0]}
    _, _, cost = rows("section", pair)
    assert cost.value == 1.0  # the rounds' ratios are 2, 1 and 1 (medians: 100 / 50 = 2)
    assert cost.verdict == "pass"


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_the_servers_instructions_are_counted_under_callgrind(
    server: servers.ServerProcess,
) -> None:
    """Every contender's count is taken, of its loop alone: a cycle of redlease's (two
    scripts) costs the server more than redis-py's (a command and a script), a fair
    section (a queued acquire, a hand-over) more than a cycle, and two counts of the same
    cycles agree to a fraction (the figure is the server's work, not the machine's speed)."""
    counts = instructions.measure(server.binary.kind, 20)
    assert set(counts) == {f"{k} cycle" for k in instructions.CYCLES} | {
        f"{k} section" for k in instructions.SECTIONS
    } | {"redlock node cycle", "raw redlock node cycle"}
    assert counts["redis-py cycle"] > 10_000
    assert counts["redlease cycle"] > counts["redis-py cycle"]
    assert counts["redlease section"] > counts["redlease cycle"]
    # a node's fenced grant (a script) costs it more than a plain SET NX PX
    assert counts["redlock node cycle"] > counts["raw redlock node cycle"] > 10_000
    with instructions.counted_server(server.binary.kind) as (port, zero, count):
        instructions.cycles("redlease", port, 20, zero)
        again = count() / 20
    assert abs(again / counts["redlease cycle"] - 1) < 0.1  # (the cron's ticks: a few %)
