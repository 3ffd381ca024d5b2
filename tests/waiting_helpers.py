"""Small helpers shared by the tests of waiting (test_waiting.py, test_batch.py)."""

from __future__ import annotations

import time
from typing import Any

import redis


def queued(r: redis.Redis, name: str) -> int:
    return int(r.llen("{" + name + "}:queue"))


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)
