"""The counter workload: N processes each run critical sections that do a non-atomic
read-modify-write (GET, a short pause, SET) of one counter under a lock.

If the lock excludes, the final counter equals the number of sections that completed
while believing they held the lock; every missing increment is a lost update. Each
section's believed-held interval is recorded on ``time.monotonic()``, one system-wide
clock on Linux, so intervals from different processes compare directly.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from ..broken import CONTENDERS

COUNTER_KEY = "chaos:counter"


@dataclass(frozen=True)
class Section:
    worker: int
    start: float
    end: float
    fence: int | None


@dataclass
class WorkloadResult:
    contender: str
    sections: list[Section] = field(default_factory=list)
    final_counter: int = 0
    timeouts: int = 0
    keys_without_ttl: list[str] = field(default_factory=list)

    @property
    def completed(self) -> int:
        return len(self.sections)

    @property
    def lost_updates(self) -> int:
        return self.completed - self.final_counter

    def overlaps(self) -> list[tuple[Section, Section]]:
        """Pairs of sections (from different workers) whose believed-held intervals meet."""
        found = []
        ordered = sorted(self.sections, key=lambda s: s.start)
        latest: Section | None = None
        for section in ordered:
            if latest is not None and section.start < latest.end:
                found.append((latest, section))
            if latest is None or section.end > latest.end:
                latest = section
        return found

    @property
    def violations(self) -> int:
        return max(0, self.lost_updates) + len(self.overlaps()) + len(self.keys_without_ttl)


@dataclass(frozen=True)
class WorkloadConfig:
    url: str
    contender: str = "redlease"
    name: str = "chaos"
    processes: int = 4
    iterations: int = 50
    ttl: float = 2.0
    work: float = 0.001  # pause between GET and SET: the window a bad lock lets others into
    timeout: float = 10.0
    options: dict[str, Any] = field(default_factory=dict)


def _worker(config: WorkloadConfig, worker: int, out: Any, start_together: Any) -> None:
    client = redis.Redis.from_url(config.url)
    contender = CONTENDERS[config.contender](client, config.name, config.ttl, **config.options)
    # Every worker starts its loop at once: fresh processes are ready a fraction of a
    # second apart, more than a short run lasts on a loaded machine, and workers that do
    # not overlap test nothing.
    start_together.wait(timeout=120)
    sections: list[Section] = []
    timeouts = 0
    for _ in range(config.iterations):
        held = contender.acquire(config.timeout)
        if held is None:
            timeouts += 1
            continue
        start = time.monotonic()
        value = int(client.get(COUNTER_KEY) or 0)
        time.sleep(config.work)
        client.set(COUNTER_KEY, value + 1)
        end = time.monotonic()
        held.release()
        sections.append(Section(worker, start, end, held.fence))
    out.put((sections, timeouts))
    client.close()


def keys_without_ttl(client: redis.Redis, pattern: str = "*") -> list[str]:
    """Lock keys that would never expire (every key redlease writes has a TTL; the
    workload's own counter is not a lock key)."""
    found = []
    for key in client.scan_iter(pattern):
        text = key.decode()
        if text == COUNTER_KEY:
            continue
        if client.pttl(key) == -1:
            found.append(text)
    return found


def run_counter_workload(config: WorkloadConfig) -> WorkloadResult:
    """Run the workload in ``config.processes`` fresh processes and collect the outcome."""
    client = redis.Redis.from_url(config.url)
    client.delete(COUNTER_KEY)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_together = ctx.Barrier(config.processes)
    procs = [
        ctx.Process(target=_worker, args=(config, i, out, start_together))
        for i in range(config.processes)
    ]
    for proc in procs:
        proc.start()
    result = WorkloadResult(config.contender)
    for _ in procs:
        sections, timeouts = out.get(timeout=600)
        result.sections.extend(sections)
        result.timeouts += timeouts
    for proc in procs:
        proc.join(timeout=30)
    result.final_counter = int(client.get(COUNTER_KEY) or 0)
    result.keys_without_ttl = keys_without_ttl(client)
    client.close()
    return result
