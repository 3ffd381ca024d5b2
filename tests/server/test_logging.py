"""What redlease logs on its failure paths, against a real server: a lease lost under
its renewer, a release that finds the lease gone. Each message names the lease by its
token's first characters (as `redlease inspect` shows holders), never by the whole token,
which would let whoever reads the log release or extend the lease; and every record
comes from the `redlease.*` logger tree.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis

import redlease
from redlease._rules.lease import short_token
from waiting_helpers import lock_key, wait_until


class Captured(logging.Handler):
    """Every record the `redlease` logger tree emits, formatted as a handler would
    (traceback included)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        return "\n".join(self.format(r) for r in self.records)

    def about(self, token: str) -> list[logging.LogRecord]:
        return [r for r in self.records if short_token(token) in self.format(r)]


@pytest.fixture
def logs() -> Iterator[Captured]:
    root = logging.getLogger("redlease")
    handler, level = Captured(), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _never_whole(logs: Captured, token: str) -> None:
    assert len(token) == 32
    assert token not in logs.text()
    assert all(r.name.startswith("redlease.") for r in logs.records)


def test_a_lease_lost_under_its_renewer(r: redis.Redis, name: str, logs: Captured) -> None:
    lease = redlease.Lock(r, name, ttl=1.0, auto_renew=True).acquire()
    r.delete(lock_key(name))
    wait_until(lambda: lease.lost)
    wait_until(lambda: bool(logs.about(lease.token)))
    [record] = logs.about(lease.token)
    assert record.levelno == logging.WARNING
    assert name in record.getMessage()
    _never_whole(logs, lease.token)


def test_a_release_that_finds_the_lease_gone(r: redis.Redis, name: str, logs: Captured) -> None:
    lock = redlease.Lock(r, name, ttl=10.0)

    def fail() -> None:
        raise RuntimeError("the block's own failure")

    with pytest.raises(RuntimeError), lock as lease:  # noqa: PT012
        r.delete(lock_key(name))
        fail()
    messages = [rec.getMessage() for rec in logs.about(lease.token)]
    assert any("was lost:" in m for m in messages)  # found by the release
    assert any("before the block that held it failed" in m for m in messages)
    _never_whole(logs, lease.token)
