"""Deliberately wrong locks: the ones SPEC section 2 (and the articles it distils) warn
against. They exist so that the demo, the fault harness and the tests can show each one
failing next to redlease. Never use them to protect anything.

Every contender here has the same tiny surface, shared with ``RedleaseContender``::

    held = contender.acquire(timeout)   # a Held, or None when the timeout passed
    held.fence                          # int fencing token, or None if it has none
    held.release()

Hooks (``between``) let a harness pause or crash a client exactly inside the window
that makes each design wrong.
"""

from __future__ import annotations

import math
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .._base.errors import LockLost

__all__ = [
    "CONTENDERS",
    "Contender",
    "GetThenDel",
    "GetsetTimestamp",
    "Held",
    "NoLock",
    "PlainDel",
    "RedleaseContender",
    "SetnxThenExpire",
]

Hook = Callable[[], None]


def _nothing() -> None:
    pass


class Held(Protocol):
    @property
    def fence(self) -> int | None: ...

    def release(self) -> None: ...


class Contender(Protocol):
    label: str

    def acquire(self, timeout: float) -> Held | None: ...


@dataclass
class _Held:
    on_release: Callable[[], None]
    fence: int | None = None

    def release(self) -> None:
        self.on_release()


def _poll(try_once: Callable[[], Held | None], timeout: float) -> Held | None:
    """How naive locks wait: try, sleep a little, try again."""
    deadline = time.monotonic() + timeout
    while True:
        held = try_once()
        if held is not None or time.monotonic() >= deadline:
            return held
        time.sleep(random.uniform(0.0005, 0.002))


class NoLock:
    """No lock at all: the baseline that shows why a lock is needed."""

    label = "no lock"

    def __init__(self, client: Any = None, name: str = "", ttl: float = 0.0) -> None:
        pass

    def acquire(self, timeout: float) -> Held | None:
        return _Held(_nothing)


class SetnxThenExpire:
    """SETNX, then EXPIRE as a second command. A crash between the two leaves a lock
    with no TTL that nobody can ever take again (PTTL = -1); release is a plain DEL."""

    label = "SETNX then EXPIRE"

    def __init__(self, client: Any, name: str, ttl: float, between: Hook = _nothing) -> None:
        self.client, self.key, self.ttl, self.between = client, f"broken:{name}", ttl, between

    def acquire(self, timeout: float) -> Held | None:
        def once() -> Held | None:
            if not self.client.setnx(self.key, "1"):
                return None
            self.between()
            self.client.expire(self.key, max(1, math.ceil(self.ttl)))
            return _Held(lambda: self.client.delete(self.key))

        return _poll(once, timeout)


class GetsetTimestamp:
    """SETNX with an expiry timestamp as the value, GETSET to take over an expired one.
    Needs synchronised client clocks, lets a late client overwrite the holder's expiry,
    and has no owner: release deletes whatever lock is there."""

    label = "SETNX timestamp + GETSET"

    def __init__(
        self, client: Any, name: str, ttl: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.client, self.key, self.ttl, self.clock = client, f"broken:{name}", ttl, clock

    def acquire(self, timeout: float) -> Held | None:
        def once() -> Held | None:
            expires = self.clock() + self.ttl
            if self.client.setnx(self.key, repr(expires)):
                return self._held(expires)
            current = self.client.get(self.key)
            if current is not None and float(current) < self.clock():
                previous = self.client.getset(self.key, repr(expires))
                if previous is None or float(previous) < self.clock():
                    return self._held(expires)
            return None

        return _poll(once, timeout)

    def _held(self, expires: float) -> Held:
        def release() -> None:
            if self.clock() < expires:  # "still mine, by my clock": the flaw
                self.client.delete(self.key)

        return _Held(release)


class PlainDel:
    """Atomic ``SET NX PX`` (right) but released with a plain DEL (wrong): a holder whose
    lease ran out deletes the next holder's lock."""

    label = "SET NX PX + plain DEL"

    def __init__(self, client: Any, name: str, ttl: float) -> None:
        self.client, self.key, self.ttl_ms = client, f"broken:{name}", max(1, int(ttl * 1000))

    def acquire(self, timeout: float) -> Held | None:
        def once() -> Held | None:
            if self.client.set(self.key, secrets.token_hex(16), nx=True, px=self.ttl_ms):
                return _Held(lambda: self.client.delete(self.key))
            return None

        return _poll(once, timeout)


class GetThenDel:
    """``SET NX PX``, released by GET (is it still mine?) then DEL: two commands, so the
    lock can expire and pass to another holder between them."""

    label = "SET NX PX + GET then DEL"

    def __init__(self, client: Any, name: str, ttl: float, between: Hook = _nothing) -> None:
        self.client, self.key, self.ttl_ms = client, f"broken:{name}", max(1, int(ttl * 1000))
        self.between = between

    def acquire(self, timeout: float) -> Held | None:
        def once() -> Held | None:
            token = secrets.token_hex(16).encode()
            if not self.client.set(self.key, token, nx=True, px=self.ttl_ms):
                return None

            def release() -> None:
                if self.client.get(self.key) == token:
                    self.between()
                    self.client.delete(self.key)

            return _Held(release)

        return _poll(once, timeout)


class RedleaseContender:
    """redlease's own lock behind the same surface (a release that finds the lease lost
    is recorded, not raised: the harness judges outcomes itself)."""

    label = "redlease"

    def __init__(self, client: Any, name: str, ttl: float, **options: Any) -> None:
        from .._sync.lock import Lock

        self.lock = Lock(client, name, ttl, **options)
        self.lost_on_release = 0

    def acquire(self, timeout: float) -> Held | None:
        from .._base.errors import AcquireTimeout

        try:
            lease = self.lock.acquire(timeout=timeout)
        except AcquireTimeout:
            return None

        def release() -> None:
            try:
                lease.release()
            except LockLost:
                self.lost_on_release += 1

        return _Held(release, lease.fence)


CONTENDERS: dict[str, Callable[[Any, str, float], Contender]] = {
    "none": NoLock,
    "setnx-expire": SetnxThenExpire,
    "getset": GetsetTimestamp,
    "plain-del": PlainDel,
    "get-del": GetThenDel,
    "redlease": RedleaseContender,
}
