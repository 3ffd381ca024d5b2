"""Errors raised by signal handlers (a Ctrl-C that the application catches and goes on
after, as a graceful shutdown does) can land between any two steps. None may leave a
lock of the process's own taken for good: after thousands of them, at random moments of
lock blocks and scheduled-job runs, the process still runs to its end."""

from __future__ import annotations

import subprocess
import sys

import pytest

from redlease.tools import servers

_SCRIPT = r"""
import faulthandler, random, signal, sys, time
import redis, redlease
faulthandler.dump_traceback_later(float(sys.argv[3]), exit=True)  # a hang: traceback, exit 1
r = redis.Redis(port=int(sys.argv[1]))
name = sys.argv[2]

def interrupt(*_):
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
rng = random.Random(7)
interrupted = 0
for i in range(int(sys.argv[4])):
    # A name of its own each time: an interrupt can be lost (one raised in a weakref
    # callback is ignored), and a block cut at its very edge can leave its lease held;
    # a later block must not wait on that. What is shared is the process's own state.
    lock = redlease.Lock(r, f"{name}:lock:{i}", ttl=30, auto_renew=True)
    job = redlease.once(r, f"{name}:job:{i}", at_most=30, ttl=1)
    body = job(lambda: None)
    try:  # the timer fires once, within this block: at the latest in the sleep
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-5, 8e-4))
        try:
            if i % 2:
                with lock:
                    pass
            else:
                body()
        except redlease.LockError:
            pass
        time.sleep(0.001)
    except KeyboardInterrupt:
        interrupted += 1
print("done", interrupted, flush=True)
"""


@pytest.mark.timeout(200)
def test_interrupts_at_random_moments_never_leave_the_process_hung(
    server: servers.ServerProcess, name: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(server.port), name, "90", "3000"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said, interrupted = done.stdout.split()[:2]
    assert said == "done"
    assert int(interrupted) > 100  # the interrupts did land, many of them inside the calls
