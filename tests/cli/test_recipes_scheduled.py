"""The scheduled jobs' recipes of docs/guides/scheduled-jobs.md, run for real: several
processes of one app, each with its own APScheduler, make one run per tick; Celery beat
started twice (every tick sent twice) makes one run per period. Each app records the
server's time of every run in a list; the tests read the periods back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from redlease.tools import servers

pytestmark = pytest.mark.slow


def _periods(r: redis.Redis, key: str, period_ms: int) -> tuple[list[int], list[int]]:
    """The periods of the runs recorded under ``key`` (each as "before:at", the server's
    ms read before the job's try and in its run, which bracket the grant): all runs'
    (their ``at``), and those of the runs whose bracket lies in one period, which is
    then the grant's (a run late on a loaded machine may straddle two)."""
    brackets = []
    for item in r.lrange(key, 0, -1):
        text = item.decode() if isinstance(item, bytes) else str(item)
        before, at = (int(ms) // period_ms for ms in text.split(":"))
        brackets.append((before, at))
    return [at for _, at in brackets], [at for before, at in brackets if before == at]


# The recipe's job: decorated by redlease.once, run by APScheduler's cron trigger at
# every second in each process.
APSCHEDULER_APP = textwrap.dedent(
    """
    import select, sys
    from datetime import timedelta

    import redis
    import redlease
    from apscheduler.schedulers.background import BackgroundScheduler

    port, name, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    r = redis.Redis(port=port)


    def server_ms() -> int:
        now, micros = r.time()
        return now * 1000 + micros // 1000


    @redlease.once(r, name, at_most=timedelta(milliseconds=900), every=timedelta(seconds=1))
    def report(before: int) -> None:
        r.rpush(name + ":runs", f"{before}:{server_ms()}")
        r.expire(name + ":runs", 300)


    def tick() -> None:
        report(server_ms())


    scheduler = BackgroundScheduler()
    scheduler.add_job(tick, "cron", second="*")
    scheduler.start()
    select.select([], [], [], seconds)
    scheduler.shutdown()
    """
)


def test_apscheduler_in_several_processes_runs_each_tick_once(
    server: servers.ServerProcess, r: redis.Redis, name: str
) -> None:
    seconds = 8.0
    apps = [
        subprocess.Popen(
            [sys.executable, "-c", APSCHEDULER_APP, str(server.port), name, str(seconds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for app in apps:
        _, err = app.communicate(timeout=60)
        assert app.returncode == 0, err
    periods, exact = _periods(r, name + ":runs", 1000)
    assert len(exact) == len(set(exact)), periods  # never two runs in one tick
    assert len(exact) >= len(periods) // 2, periods  # (most runs lie in one tick)
    assert periods == sorted(periods), periods
    assert len(periods) >= seconds - 3, periods


CELERY_APP = textwrap.dedent(
    """
    import os
    from datetime import timedelta

    import redis
    import redlease
    from celery import Celery

    port, name = int(os.environ["RECIPE_PORT"]), os.environ["RECIPE_NAME"]
    app = Celery("tasks", broker=f"redis://localhost:{port}/1")
    app.conf.beat_schedule = {"report": {"task": "tasks.report", "schedule": 2.0}}
    app.conf.broker_connection_retry_on_startup = True
    r = redis.Redis(port=port)


    def server_ms() -> int:
        now, micros = r.time()
        return now * 1000 + micros // 1000


    @redlease.once(r, name, at_most=timedelta(seconds=1.5), every=timedelta(seconds=2))
    def report_once(before: int) -> None:
        r.rpush(name + ":runs", f"{before}:{server_ms()}")
        r.expire(name + ":runs", 300)


    @app.task(ignore_result=True)
    def report() -> None:
        r.rpush(name + ":calls", 1)
        r.expire(name + ":calls", 300)
        report_once(server_ms())
    """
)


def test_celery_beat_started_twice_runs_each_period_once(
    server: servers.ServerProcess, r: redis.Redis, name: str, tmp_path: Path
) -> None:
    (tmp_path / "tasks.py").write_text(CELERY_APP)
    env = {
        **os.environ,
        "RECIPE_PORT": str(server.port),
        "RECIPE_NAME": name,
        "PYTHONPATH": str(tmp_path),
    }
    celery = [sys.executable, "-m", "celery", "-A", "tasks"]
    worker = [*celery, "worker", "--pool", "solo", "--loglevel", "warning", "-n", f"w@{name}"]
    started = [subprocess.Popen(worker, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)]
    for beat in ("a", "b"):
        argv = [*celery, "beat", "--loglevel", "warning", "--schedule", str(tmp_path / beat)]
        started.append(
            subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
        )

    def enough() -> bool:
        """Four periods run, and both beats sending (their start on a loaded machine
        takes a varying share of any fixed time: 2 periods in 16 s were seen)."""
        runs = len(r.lrange(name + ":runs", 0, -1))
        return runs >= 4 and len(r.lrange(name + ":calls", 0, -1)) >= 1.5 * runs + 1

    try:
        deadline = time.monotonic() + 120
        while not enough() and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        for process in reversed(started):
            process.send_signal(signal.SIGTERM)
        errors = [process.communicate(timeout=30)[1] for process in started]
    r1 = redis.Redis(port=server.port, db=1)
    r1.flushdb()  # (the broker's queue, in a database of its own)
    r1.close()
    periods, exact = _periods(r, name + ":runs", 2000)
    calls = len(r.lrange(name + ":calls", 0, -1))
    assert len(exact) == len(set(exact)), (periods, errors)  # never two in a period
    assert len(exact) >= len(periods) // 2, (periods, errors)  # (most lie in one period)
    assert len(periods) >= 4, (periods, errors)
    assert calls >= 1.5 * len(periods), (calls, periods)  # both beats sent each tick
