"""One worker process of the harness: ``python -m redlease.tools.chaos.worker`` reads its
configuration (one JSON line) on stdin, says "ready", reads the start time, and at the
end prints its record (JSON) on stdout.

Each critical section, under the lock: read both counters of the resource (the fenced
read carries the token), pause briefly (the window a bad lock lets others into), write
both back plus one. The believed-held interval runs from the moment ``acquire`` returned
to the moment the writes were done, on ``time.monotonic()``.

Injected faults that must be deterministic happen here, at a chosen section: sleep past
the lease before writing, stop the whole process (``SIGSTOP`` on itself; the harness sends
``SIGCONT``), or pause/crash inside a broken lock's bad window (``between``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from ..._rules.keys import LockKeys
from .. import broken
from .resource import Gates, Resource

# A worker planned to die while queued does so this long into a wait (it is queued by
# then: its first try ran long before).
DIE_AFTER = 0.15
# How long after a release a node may still hold its token (the release's message to it
# in flight) before the audit counts it left behind; well under the harness's ttls.
AUDIT_GRACE = 0.2


def _sleep(seconds: float) -> None:
    # select() instead of time.sleep(): libfaketime (client clock-jump scenario) breaks
    # clock_nanosleep when it leaves the monotonic clock alone.
    if seconds > 0:
        select.select([], [], [], seconds)


@dataclass
class _Holding:
    fence: int | None
    release: Any
    lease: Any = None  # the redlease lease, when there is one
    # "x": exclusive (a lock, a write lease, a leader, a multi-lock); "r": a read lease;
    # "s": a semaphore's permit (shared up to its limit)
    mode: str = "x"


class _Worker:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.index: int = config["worker"]
        timeout = config.get("socket_timeout", 1.0)
        self.clients = [
            redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
            for url in config["lock_urls"]
        ]
        self.resource_client = redis.Redis.from_url(config["resource_url"])
        self.resource = Resource(self.resource_client)
        dsn = config.get("gates_dsn")  # rows 20: the counters behind the fence gates too
        self.gates = Gates(self.resource_client, dsn) if dsn else None
        self.audit_clients = [
            redis.Redis.from_url(url, socket_timeout=5.0) for url in config.get("audit_urls", [])
        ]
        self.notifications: list[tuple[float, float]] = []
        self.lost_on_release = 0
        self.leftovers = 0
        self.sections_done = 0
        self.contender = self._contender()

    def _on_lost(self, lease: Any) -> None:
        self.notifications.append((time.monotonic(), float(lease.valid_until)))

    def _between(self) -> Any:
        action = self.config.get("between")
        if action is None or self.index != self.config.get("between_worker", 0):
            return None
        calls = {"n": 0}

        def hook() -> None:
            calls["n"] += 1
            if calls["n"] > self.config.get("between_calls", 3):
                return
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                _sleep(float(action))

        return hook

    def _contender(self) -> Any:
        kind = self.config["contender"]
        name, ttl = self.config["name"], self.config["ttl"]
        options = dict(self.config.get("options", {}))
        if kind in ("redlease", "redlock"):
            import redlease

            if self.config.get("auto_renew"):
                options.update(auto_renew=True, on_lost=self._on_lost)
            redlock: type[redlease.Redlock] = redlease.Redlock
            if "unsafe" in options:  # a deliberately broken Redlock (see harness.BROKEN)
                from .unsafe import Unsafe, unsafe_redlock

                redlock = unsafe_redlock(redlock, Unsafe(**options.pop("unsafe")))
            if kind == "redlock":
                return redlock(self.clients, name, ttl, **options)
            return self._primitive(self.config.get("primitive", ""), name, ttl, options)
        hook = self._between()
        if hook is not None:
            options["between"] = hook
        return broken.CONTENDERS[kind](self.clients[0], name, ttl, **options)

    def _primitive(self, primitive: str, name: str, ttl: float, options: dict[str, Any]) -> Any:
        """The redlease primitive a row-19 plan exercises ("": the lock)."""
        import redlease

        client = self.clients[0]
        if primitive == "election":  # always renewed; ``on_lost`` only as the plan says
            options.pop("auto_renew", None)
            return redlease.Election(client, name, ttl, identity=f"worker-{self.index}", **options)
        if primitive == "multilock":  # the same two names, listed in either order
            names = [name + ":a", name + ":b"][:: 1 if self.index % 2 else -1]
            return redlease.MultiLock(client, names, ttl, **options)
        if primitive.startswith("semaphore:"):
            return redlease.Semaphore(client, name, int(primitive.split(":")[1]), ttl, **options)
        if primitive == "readwrite":
            return redlease.ReadWriteLock(client, name, ttl, **options)
        return redlease.Lock(client, name, ttl, **options)

    def acquire(self, timeout: float) -> _Holding | None:
        import redlease

        if self.config.get("primitive"):
            return self._take_primitive(timeout)
        if isinstance(self.contender, (redlease.Lock, redlease.Redlock)):
            lock: Any = self.contender
            try:
                lease = lock.acquire(timeout=timeout)
            except redlease.AcquireTimeout:
                return None

            def release() -> None:
                try:
                    lease.release()
                except redlease.LockLost:
                    self.lost_on_release += 1
                finally:
                    self._audit(lock.name, lease.token)

            return _Holding(lease.fence, release, lease)
        held = self.contender.acquire(timeout)
        return None if held is None else _Holding(held.fence, held.release)

    def _take_primitive(self, timeout: float) -> _Holding | None:
        import redlease

        primitive, used = self.config["primitive"], self.contender
        mode = "x"
        try:
            if primitive == "election":
                lease = used.campaign(timeout=timeout)
            elif primitive == "readwrite":  # every third section of a worker writes
                mode = "x" if (self.sections_done + self.index) % 3 == 0 else "r"
                lease = (used.write if mode == "x" else used.read).acquire(timeout=timeout)
            else:
                lease = used.acquire(timeout=timeout)
                mode = "s" if primitive.startswith("semaphore:") else "x"
        except redlease.AcquireTimeout:
            return None
        fence = min(lease.fences.values()) if primitive == "multilock" else lease.fence

        def release() -> None:
            try:
                if primitive == "election":
                    used.resign()
                else:
                    lease.release()
            except redlease.LockLost:
                self.lost_on_release += 1

        return _Holding(fence, release, lease, mode)

    def _audit(self, name: str, token: str) -> None:
        """Count the nodes (read directly, not through any proxy) where the token just
        released is still the lock's value a moment later: a key left behind. (A release
        returns once a majority said yes; its message to the last node may still be on
        its way, and lands within the moment.)"""
        key = LockKeys.for_name(name).lock
        still = [c for c in self.audit_clients if c.get(key) == token.encode()]
        if still:
            _sleep(AUDIT_GRACE)
            self.leftovers += sum(1 for c in still if c.get(key) == token.encode())

    def run(self) -> dict[str, Any]:
        cfg = self.config
        pauses = {int(p["section"]): p for p in cfg.get("pauses", []) if p["worker"] == self.index}
        sections: list[list[Any]] = []
        errors: list[str] = []
        timeouts = 0
        _sleep(cfg["start_at"] - time.monotonic())
        deadline = cfg["start_at"] + cfg["duration"]
        for attempt in range(cfg.get("max_attempts", 100000)):
            if time.monotonic() >= deadline or len(sections) >= cfg.get("max_sections", 10**6):
                break
            asked = time.monotonic()
            doom = self._doom(attempt)
            try:
                holding = self.acquire(cfg["timeout"])
            except Exception as exc:  # a faulted server: note it, back off, go on
                errors.append(f"acquire: {type(exc).__name__}: {exc}"[:200])
                _sleep(0.05)
                continue
            finally:
                if doom is not None:
                    doom.cancel()  # the lock was free: die during a later attempt
            if holding is None:
                timeouts += 1
                continue
            start = time.monotonic()
            pause = pauses.get(len(sections))
            self.sections_done = len(sections)
            sections.append(self._section(holding, asked, start, pause))
            try:
                holding.release()
            except Exception as exc:
                errors.append(f"release: {type(exc).__name__}: {exc}"[:200])
            if attempt % 2 == 1:
                _sleep(cfg.get("think", 0.0))
        return {
            "worker": self.index,
            "sections": sections,
            "timeouts": timeouts,
            "errors": errors,
            "notifications": self.notifications,
            "lost_on_release": self.lost_on_release,
            "leftovers": self.leftovers,
            "gates": self.gates.counts if self.gates is not None else {},
        }

    def _doom(self, attempt: int) -> threading.Timer | None:
        """For the worker planned to die while queued: a timer that kills this process
        (SIGKILL) if this acquire is still waiting DIE_AFTER seconds after it began."""
        planned = self.config.get("die_waiting")
        if planned is None or attempt < planned:
            return None
        timer = threading.Timer(DIE_AFTER, _die)
        timer.daemon = True
        timer.start()
        return timer

    def _section(
        self,
        holding: _Holding,
        asked: float,
        start: float,
        pause: dict[str, Any] | None,
    ) -> list[Any]:
        fence, mode = holding.fence, holding.mode
        value = self.resource.read()
        # A reader writes nothing; a permit only through the fence (holders beside it
        # would lose each other's updates to the plain counter, as they may).
        fenced = self.resource.fenced_read(fence) if fence is not None and mode != "r" else None
        gated = self.gates.read(fence) if self.gates and fence is not None and mode == "x" else None
        work = self.config["work"]
        if holding.lease is not None and self.sections_done in self.config.get("forks", []):
            _fork_and_leave(holding.lease)
        if holding.lease is not None and self.config.get("to_validity"):
            work = max(work, holding.lease.remaining() - 0.005)  # all the validity it was given
        _sleep(work)
        if pause is not None:
            if pause["kind"] == "sigstop":
                os.kill(os.getpid(), signal.SIGSTOP)  # the harness sends SIGCONT later
            else:
                _sleep(float(pause["seconds"]))
        lease = holding.lease
        if lease is not None and self.config.get("auto_renew") and lease.lost:
            # Told in time: a careful holder stops here and writes nothing.
            end = time.monotonic()
            return [self.index, start, end, fence, start - asked, "lost", pause is not None, mode]
        if mode == "x":
            self.resource.write(value + 1)
        if self.gates is not None and gated is not None and fence is not None:
            self.gates.write(fence, gated)
        outcome = "none" if mode != "r" else "read"
        if fence is not None and mode != "r":
            if fenced is None:
                outcome = "rejected"
            else:
                accepted = self.resource.fenced_write(fence, fenced, fenced + 1)
                outcome = "accepted" if accepted else "rejected"
        end = time.monotonic()
        return [self.index, start, end, fence, start - asked, outcome, pause is not None, mode]

    def close(self) -> None:
        for client in self.clients + self.audit_clients:
            client.close()
        self.resource_client.close()
        if self.gates is not None:
            self.gates.close()


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _fork_and_leave(lease: Any) -> None:
    """Fork; the child leaves the lease's ``with`` block by sys.exit, which must not
    release the parent's lock. The parent waits for it, then goes on with its section."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork of a threaded process
        pid = os.fork()
    if pid == 0:
        code = 0
        try:
            with lease:
                sys.exit(0)
        except SystemExit:
            pass
        except BaseException:
            code = 1
        os._exit(code)
    os.waitpid(pid, 0)


def main() -> int:
    # One line of configuration; "ready" once built; then the start time (monotonic).
    config = json.loads(sys.stdin.readline())
    worker = _Worker(config)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    config["start_at"] = float(sys.stdin.readline())
    try:
        record = worker.run()
    finally:
        worker.close()
    sys.stdout.write(json.dumps(record))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
