"""Errors raised by signal handlers (a Ctrl-C that the application catches and goes on
after, as a graceful shutdown does) can land between any two steps. None may leave a
lock of the process's own taken for good: after thousands of them, at random moments of
lock blocks and scheduled-job runs, the process still runs to its end."""

from __future__ import annotations

import subprocess
import sys

from redlease.tools import servers

_SCRIPT = r"""
import faulthandler, random, signal, sys, time
import redis, redlease
faulthandler.dump_traceback_later(float(sys.argv[3]), exit=True)  # a hang: traceback, exit 1
r = redis.Redis(port=int(sys.argv[1]))
name = sys.argv[2]
lock = redlease.Lock(r, name + ":lock", ttl=30, auto_renew=True)
job = redlease.once(r, name + ":job", at_most=30, ttl=1)

@job
def body():
    pass

def interrupt(*_):
    raise KeyboardInterrupt

signal.signal(signal.SIGALRM, interrupt)
rng = random.Random(7)
interrupted = 0
for i in range(int(sys.argv[4])):
    try:  # the timer fires once, within this block: at the latest in the sleep
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-5, 8e-4))
        try:
            if i % 2:
                with lock:
                    pass
            else:
                body()
        except redlease.LockError:
            pass  # a block interrupted at its very edge may leave its lease behind
        time.sleep(0.001)
    except KeyboardInterrupt:
        interrupted += 1
    r.delete(f"redlease:{{{name}:job}}", f"redlease:{{{name}:job}}:once")
print("done", interrupted, flush=True)
"""


def test_interrupts_at_random_moments_never_leave_the_process_hung(
    server: servers.ServerProcess, name: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(server.port), name, "150", "3000"],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said, interrupted = done.stdout.split()[:2]
    assert said == "done"
    assert int(interrupted) > 100  # the interrupts did land, many of them inside the calls
