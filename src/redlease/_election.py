"""``Election`` and ``AsyncElection``: one leader of a name at a time, with terms.

A candidate is a waiter of a lock kept under the election's keys (``P{N}:elect``), with
``auto_renew``: ``campaign()`` waits in the lock's queue (multiplexed, fair, a dead
candidate skipped) and returns the lease; its fence is the term, strictly increasing.
The candidate's identity rides at the end of its token (in hex), so who leads is read
from the lock key alone, atomically with its term (the fence counter, which only a grant
moves) and its time left. A leader that loses its lease is told by the renewer before
the lease's validity ends, so before a successor can be granted the lock.

Observers register in a hash of the election and are rung, as waiters are, by whoever
changed the leader (the winner of a campaign, or a candidate resigning); a leader that
dies changes nothing on the server until its lease runs out, and observers wake up then
(their wait is bounded by its time left). ``observe()`` yields the leader after each
change; a consumer slower than the changes sees the latest one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from . import _arguments as args
from . import _fork
from ._backend_async import shielded
from ._errors import BackendError, LockLost
from ._flows import (
    ELECTION,
    EXPIRY_NUDGE,
    MIN_WAIT,
    PASSING_RETRY_BASE,
    PASSING_RETRY_CAP,
    Box,
    Flow,
    Listen,
    LockSpec,
    Wait,
    as_int,
    as_text,
    new_token,
)
from ._fronts import check_client
from ._io_async import AsyncIO
from ._io_sync import SyncIO
from ._keys import DEFAULT_PREFIX
from ._lease_async import AsyncLease
from ._lease_sync import Lease
from ._lock import OnLost, check_replicas
from ._lock_async import AsyncOneServer
from ._lock_sync import OneServer
from ._scripts import ELECTION_ANNOUNCE, ELECTION_WATCH
from ._timing import QUEUE_ENTRY_SLACK

Seconds = float | timedelta
log = logging.getLogger(__name__)

TOKEN_HEX = 32  # new_token()'s length; the identity's hex follows


@dataclass(frozen=True)
class Leader:
    """Who leads an election, and since which term (the fence of its lease)."""

    identity: str
    term: int


def _default_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _leader_of(reply: Any) -> tuple[Leader | None, int]:
    token, term, pttl = as_text(reply[0]), as_int(reply[1]), as_int(reply[2])
    if not token:
        return None, -2
    try:
        identity = bytes.fromhex(token[TOKEN_HEX:]).decode()
    except ValueError:  # not a candidate's token: something else wrote the key
        identity = "?"
    return Leader(identity, term), pttl


class _ElectionConfig:
    """Arguments shared by the twins, checked once, and the flows they run."""

    def __init__(
        self,
        name: object,
        ttl: object,
        *,
        identity: object,
        on_lost: object,
        prefix: object,
        replicas: object,
        replica_timeout: object,
    ) -> None:
        who = _default_identity() if identity is None else args.identity(identity)
        self._identity = who
        self._spec = LockSpec.create(
            name,
            ttl,
            prefix=prefix,
            replicas=replicas,
            replica_timeout=replica_timeout,
            kind=ELECTION,
            token_tail=who.encode().hex(),
        )
        self._on_lost: OnLost | None = args.callback(on_lost, "on_lost")  # type: ignore[assignment]
        self._observers = self._spec.keys.lock + ":observers"

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._spec.name

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._spec.ttl

    @property
    def identity(self) -> str:
        """This candidate's identity, as ``leader()`` reports it."""
        return self._identity

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} identity={self.identity!r}>"

    # -- flows -----------------------------------------------------------------------------

    def _keys(self) -> tuple[str, str, str]:
        return (self._spec.keys.lock, self._spec.keys.fence, self._observers)

    def _read(self) -> Flow[tuple[Leader | None, int]]:
        spec = self._spec
        reply = yield spec.call(ELECTION_WATCH, "", "0", "", keys=self._keys())
        return _leader_of(reply)

    def _announce(self) -> Flow[None]:
        spec = self._spec
        yield spec.call(ELECTION_ANNOUNCE, spec.keys.bell_prefix, keys=self._keys())

    def _look(self, token: str, box: Box | None) -> Flow[tuple[Leader | None, float, Box | None]]:
        """Register as an observer (through the hub if there is one) and read who leads;
        also how long to wait for a ring: until the leader's lease runs out, at most a
        ttl (a leader elected and gone without a word is seen then)."""
        spec = self._spec
        if box is None or box.token != token:
            box = yield Listen(spec.keys.bell_prefix, token, spec.reply_timeout)
        if box is not None and not box.ready:
            box = yield Listen(spec.keys.bell_prefix, token, spec.reply_timeout, box)
        horizon = max(spec.ttl, MIN_WAIT)
        life = math.ceil((horizon + QUEUE_ENTRY_SLACK) * 1000)
        hub = "" if box is None else box.hub
        reply = yield spec.call(ELECTION_WATCH, token, str(life), hub, keys=self._keys())
        leader, pttl = _leader_of(reply)
        if pttl >= 0:
            horizon = min(horizon, pttl / 1000 + EXPIRY_NUDGE)
        return leader, max(horizon, MIN_WAIT), box

    @staticmethod
    def _after(failure: BackendError, failures: int) -> float:
        """How long an observer waits before looking again after its ``failures``-th
        failure in a row: one that may pass (the server restarting, failing over,
        unreachable for a while) is waited out, for ever; any other is raised."""
        from ._backend_errors import passing  # (it imports the wire format)

        if not passing(failure):
            raise failure
        ceiling = min(PASSING_RETRY_CAP, PASSING_RETRY_BASE * 2 ** min(failures, 10))
        return random.uniform(ceiling / 2, ceiling)

    def _rung(self, token: str, box: Box | None, wait: float) -> Flow[None]:
        spec = self._spec
        yield Wait(spec.keys.bell(token), wait, spec.reply_timeout, None, box)


class _Candidacy(OneServer):
    """The lock a sync candidate waits for (always renewed)."""

    def __init__(self, spec: LockSpec, io: SyncIO, on_lost: OnLost | None) -> None:
        self._spec, self._io, self._on_lost = spec, io, on_lost
        self._auto_renew, self._max_hold = True, None
        self._noun = self._metric_kind = "election"

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._spec.name


class _AsyncCandidacy(AsyncOneServer):
    """The lock an asyncio candidate waits for (always renewed)."""

    def __init__(
        self, spec: LockSpec, io: AsyncIO, on_lost: OnLost | None, cancel_on_lost: bool
    ) -> None:
        self._spec, self._io, self._on_lost = spec, io, on_lost
        self._auto_renew, self._max_hold = True, None
        self._cancel_on_lost = cancel_on_lost
        self._noun = self._metric_kind = "election"

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._spec.name


class Election(_ElectionConfig):
    """Leader election on one Redis/Valkey deployment (sync).

    ``campaign(timeout=None)`` waits until this candidate leads and returns its
    leadership lease: renewed automatically while held, ``fence`` is the term (strictly
    increasing across leaders), ``lost``/``check()``/``on_lost`` tell the leader when it
    no longer leads, before a successor can be elected. ``resign()`` hands leadership
    to the next candidate at once. ``leader()`` says who leads now (``Leader(identity,
    term)``) or None; ``observe()`` yields the leader after each change, woken by the
    server. ``identity`` defaults to "hostname:pid".
    """

    def __init__(
        self,
        client: Any,
        name: str,
        ttl: Seconds = 10.0,
        *,
        identity: str | None = None,
        on_lost: OnLost | None = None,
        prefix: str = DEFAULT_PREFIX,
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
    ) -> None:
        check_client(client, want_async=False, sync_twin="Election")
        super().__init__(
            name,
            ttl,
            identity=identity,
            on_lost=on_lost,
            prefix=prefix,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        self._io = SyncIO(client)
        check_replicas(self._spec, self._io.direct)
        self._candidacy = _Candidacy(self._spec, self._io, self._on_lost)
        self._lease: Lease | None = None

    def campaign(self, timeout: Seconds | None = None) -> Lease:
        """Wait until this candidate leads (``timeout``: as ``Lock.acquire``'s, raising
        ``AcquireTimeout``) and return the leadership lease. Campaigning while leading
        returns the lease held."""
        held = self._lease
        if held is not None and not (held.lost or held.released):
            return held
        lease = self._candidacy.acquire(timeout)
        self._lease = lease
        try:
            self._tell("elected")
        except BaseException:  # interrupted before the caller had the lease: hand it on
            self.resign()
            raise
        return lease

    def resign(self) -> None:
        """Stop leading (if this candidate leads): the next candidate leads at once."""
        lease, self._lease = self._lease, None
        if lease is None:
            return
        with contextlib.suppress(LockLost):  # it had been lost: nothing to hand over
            lease.release()
        self._tell("resigned")

    def leader(self) -> Leader | None:
        """Who leads now and since which term; None if nobody does."""
        leader, _ = self._io.run(self._read(), f"read the leader of {self.name!r}")
        return leader

    def observe(self) -> Observation:
        """An iterator of the leader now, then after each change (None while nobody
        leads), until its ``close()``. Woken by the server when a leader is elected or
        resigns, and when a leader's lease runs out; a consumer slower than the changes
        sees the latest. A server that is unreachable for a while (restarting, failing
        over) is waited for; any other failure is raised."""
        return Observation(self)

    def _tell(self, what: str) -> None:
        try:
            self._io.run(self._announce(), f"announce {self.name!r}")
        except BackendError as failure:  # observers still see it, when they next look
            log.warning(
                "election %r: %s, but observers were not told: %s", self.name, what, failure
            )


class Observation:
    """What ``Election.observe()`` returns: iterate it for the leader after each change.
    ``close()`` (from any thread; or leaving ``with observation:``) ends the iteration:
    at once while it waits through the process's hub, else within a ttl."""

    def __init__(self, election: Election) -> None:
        self._election = election
        self._token = new_token()
        self._box: Box | None = None
        self._last: Any = Observation  # (no leader seen yet: not even None)
        self._failures = 0
        self._closed = threading.Event()
        _fork.renew_in_child(self)

    def _after_fork(self) -> None:
        # The event's lock may have been held by a thread of the parent (closing, or
        # starting a wait) at the fork; whether it was closed carries over.
        closed, self._closed = self._closed.is_set(), threading.Event()
        if closed:
            self._closed.set()

    def __iter__(self) -> Observation:
        return self

    def __next__(self) -> Leader | None:
        election, action = self._election, f"observe {self._election.name!r}"
        while not self._closed.is_set():
            try:
                leader, wait, self._box = election._io.run(
                    election._look(self._token, self._box), action
                )
            except BackendError as failure:
                self._failures += 1
                self._closed.wait(election._after(failure, self._failures))
                continue
            self._failures = 0
            if leader != self._last:
                self._last = leader
                return leader
            if not self._closed.is_set():
                election._io.run(election._rung(self._token, self._box, wait), action)
        raise StopIteration

    def close(self) -> None:
        """Stop observing (the registration on the server runs out by itself)."""
        self._closed.set()
        box = self._box
        if box is not None:
            box.put(None)  # wakes a wait in progress

    def __enter__(self) -> Observation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncElection(_ElectionConfig):
    """Leader election (asyncio twin of ``Election``); ``observe()`` is an async
    iterator. ``cancel_on_lost=True`` also cancels the task that won the campaign when
    its leadership is lost, as for ``AsyncLock``."""

    def __init__(
        self,
        client: Any,
        name: str,
        ttl: Seconds = 10.0,
        *,
        identity: str | None = None,
        on_lost: OnLost | None = None,
        cancel_on_lost: bool = False,
        prefix: str = DEFAULT_PREFIX,
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
    ) -> None:
        check_client(client, want_async=True, sync_twin="Election")
        super().__init__(
            name,
            ttl,
            identity=identity,
            on_lost=on_lost,
            prefix=prefix,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        self._io = AsyncIO(client)
        check_replicas(self._spec, self._io.direct)
        cancel = args.flag(cancel_on_lost, "cancel_on_lost")
        self._candidacy = _AsyncCandidacy(self._spec, self._io, self._on_lost, cancel)
        self._lease: AsyncLease | None = None

    async def campaign(self, timeout: Seconds | None = None) -> AsyncLease:
        """As ``Election.campaign``; a candidate cancelled while it waits leaves the
        queue (and gives back a leadership granted meanwhile)."""
        held = self._lease
        if held is not None and not (held.lost or held.released):
            return held
        lease = await self._candidacy.acquire(timeout)
        self._lease = lease
        try:
            await self._tell("elected")
        except BaseException:  # cancelled before the caller had the lease: hand it on
            await shielded(self.resign())
            raise
        return lease

    async def resign(self) -> None:
        """As ``Election.resign``."""
        lease, self._lease = self._lease, None
        if lease is None:
            return
        with contextlib.suppress(LockLost):
            await lease.release()
        await self._tell("resigned")

    async def leader(self) -> Leader | None:
        """As ``Election.leader``."""
        leader, _ = await self._io.run(self._read(), f"read the leader of {self.name!r}")
        return leader

    async def observe(self) -> AsyncIterator[Leader | None]:
        """As ``Election.observe``, for ``async for`` (an async generator: cancel the
        task, or ``aclose()`` it, to stop)."""
        token, box = new_token(), None
        last: Any = object()
        failures = 0
        while True:
            try:
                leader, wait, box = await self._io.run(
                    self._look(token, box), f"observe {self.name!r}"
                )
            except BackendError as failure:
                failures += 1
                await asyncio.sleep(self._after(failure, failures))
                continue
            failures = 0
            if leader != last:
                last = leader
                yield leader
                continue
            await self._io.run(self._rung(token, box, wait), f"observe {self.name!r}")

    async def _tell(self, what: str) -> None:
        try:
            await self._io.run(self._announce(), f"announce {self.name!r}")
        except BackendError as failure:
            log.warning(
                "election %r: %s, but observers were not told: %s", self.name, what, failure
            )
