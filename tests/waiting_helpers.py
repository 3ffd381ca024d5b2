"""Small helpers shared by the tests: a lock's keys, waiting for a condition, waiters."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis

import redlease
from redlease._rules.keys import LockKeys


def lock_key(name: str) -> str:
    """The key of the lock ``name`` (default prefix); its other keys add a suffix to it."""
    return LockKeys.for_name(name).lock


def queued(r: redis.Redis, name: str) -> int:
    return int(r.llen(lock_key(name) + ":line"))


async def until_queued(queued: Any) -> None:
    """In asyncio, until ``queued()`` (a count of waiters) is not zero."""
    for _ in range(4000):
        if queued():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("nobody queued")


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


class Waiters:
    """``count`` threads, each waiting for ``lock`` once and holding it for a moment."""

    def __init__(self, lock: redlease.Lock, count: int, timeout: float | None = 120.0) -> None:
        self.done: list[int] = []
        self.errors: list[BaseException] = []

        def waiter(i: int) -> None:
            try:
                with lock.acquire(timeout=timeout):
                    self.done.append(i)
            except BaseException as exc:
                self.errors.append(exc)

        self.threads = [threading.Thread(target=waiter, args=(i,)) for i in range(count)]
        for t in self.threads:
            t.start()

    def join(self) -> None:
        """Every waiter served, none failed."""
        for t in self.threads:
            t.join(timeout=120)
        assert self.errors == [], self.errors
        assert sorted(self.done) == list(range(len(self.threads)))


def in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a thread of its own (another holder); its result, or its error,
    lands in the list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # looked at by the test
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def script_calls(commandstats: dict[str, Any]) -> int:
    """How many scripts a server has run, from its ``INFO commandstats``: FCALL, EVALSHA
    and EVAL (the commands they call are counted apart)."""
    return sum(
        int(commandstats.get(f"cmdstat_{c}", {}).get("calls", 0))
        for c in ("fcall", "evalsha", "eval")
    )
