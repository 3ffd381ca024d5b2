# Generated from _async/election.py by scripts/unasync.py: edit that file, then run
# `python scripts/unasync.py` (the tests run it with --check).
"""``Election``: candidates wait for a lock kept under the election's keys, and
observers are rung when the leader changes (the rules are in ``_rules.election``). Written once,
as asyncio code; ``scripts/unasync.py`` generates the blocking twin (``Election``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from .._base.errors import BackendError, LockLost
from .._base.types import OnLost, Seconds
from .._clients.checks import check_client
from .._rules import arguments as args
from .._rules.election import (
    Leader,
    announce_change,
    default_identity,
    look,
    observers_of,
    read_leader,
    retry_after,
    rung,
)
from .._rules.flows import ELECTION, LockSpec, new_token
from .._rules.front import FrontCore
from .._rules.ops import Mailbox
from .backend import ASYNC, BlockBase, Flag, going_away, shielded
from .front import Front, Lease, give_back_in_haste
from .io import IO, served

log = logging.getLogger(__name__)


class _Candidacy(Front):
    """The lock a candidate waits for (always renewed)."""


class Election:
    """Leader election on one Redis/Valkey deployment.

    ``campaign(timeout=None)`` waits until this candidate leads and returns its
    leadership lease: renewed automatically while held, ``fence`` is the term (strictly
    increasing across leaders), ``lost``/``check()``/``on_lost`` tell the leader when it
    no longer leads, before a successor can be elected. ``resign()`` hands leadership to
    the next candidate at once. ``leader()`` says who leads now (``Leader(identity,
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
        prefix: str = "redlease:",
        replicas: int = 0,
        replica_timeout: Seconds | None = None,
    ) -> None:
        check_client(client, want_async=ASYNC, sync_twin="Election")
        who = default_identity() if identity is None else args.identity(identity)
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
        core = FrontCore(
            self._spec,
            auto_renew=True,
            on_lost=args.callback(on_lost, "on_lost"),  # type: ignore[arg-type]
            noun="election",
            kind="election",
        )
        self._observers = observers_of(self._spec)
        self._io = served(client, self._spec)
        self._candidacy = _Candidacy(core, self._io)
        self._lease: Lease | None = None

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._spec.name

    @property
    def ttl(self) -> float:
        """The leadership lease's length, in seconds."""
        return self._spec.ttl

    @property
    def identity(self) -> str:
        """This candidate's identity, as ``leader()`` reports it."""
        return self._identity

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} identity={self.identity!r}>"

    def campaign(self, timeout: Seconds | None = None) -> Lease:
        """Wait until this candidate leads (``timeout``: as ``Lock.acquire``'s, raising
        ``AcquireTimeout``) and return the leadership lease. Campaigning while leading
        returns the lease held. A candidate interrupted while it waits leaves the queue,
        and gives back a leadership granted meanwhile."""
        held = self._lease
        if held is not None and not (held.lost or held.released):
            return held
        lease = self._candidacy.acquire(timeout)
        self._lease = lease
        try:
            self._tell("elected")
        except BaseException as exc:  # interrupted before the caller had the lease
            # hand it on, and say so; in haste if the process is going away (see
            # _rules.flows.release)
            shielded(self._give_up, going_away(exc))
            raise
        return lease

    def _give_up(self, hurried: bool) -> None:
        (self._resign_in_haste() if hurried else self.resign())

    def _resign_in_haste(self) -> None:
        """Give leadership back within half a second, no retry, no announcement:
        what a server that does not answer keeps expires with the ttl (and observers
        see the change when they next look). Forgotten once given back: a run cut
        short is run again (see ``shielded``)."""
        lease = self._lease
        if lease is not None:
            with contextlib.suppress(Exception):
                give_back_in_haste(lease)
            self._lease = None

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
        flow = read_leader(self._spec, self._observers)
        leader, _ = self._io.run(flow, f"read the leader of {self.name!r}")
        return leader

    def observe(self) -> Observation:
        """The leader now, then after each change (None while nobody leads), to iterate
        until the observation is closed. Woken by the server when a leader is elected or
        resigns, and when a leader's lease runs out; a consumer slower than the changes
        sees the latest. A server that is unreachable for a while (restarting, failing
        over) is waited for; any other failure is raised."""
        return Observation(self._io, self._spec, self._observers)

    def _tell(self, what: str) -> None:
        try:
            flow = announce_change(self._spec, self._observers)
            self._io.run(flow, f"announce {self.name!r}")
        except BackendError as failure:  # observers still see it, when they next look
            log.warning(
                "election %r: %s, but observers were not told: %s", self.name, what, failure
            )


class Observation(BlockBase):
    """What ``observe()`` returns: iterate it for the leader after each change.
    ``close()`` (from any thread), or leaving its ``with`` block, ends the iteration: at
    once while it waits through the process's hub, else within a ttl."""

    def __init__(self, io: IO, spec: LockSpec, observers: str) -> None:
        self._io, self._spec, self._observers = io, spec, observers
        self._token = new_token()
        self._box: Mailbox | None = None
        self._last: Any = Observation  # (no leader seen yet: not even None)
        self._failures = 0
        self._closed = Flag()

    def __iter__(self) -> Observation:
        return self

    def __next__(self) -> Leader | None:
        spec, action = self._spec, f"observe {self._spec.name!r}"
        while not self._closed.is_set():
            try:
                leader, wait, self._box = self._io.run(
                    look(spec, self._observers, self._token, self._box), action
                )
            except BackendError as failure:
                self._failures += 1
                self._closed.wait(retry_after(failure, self._failures))
                continue
            self._failures = 0
            if leader != self._last:
                self._last = leader
                return leader
            if not self._closed.is_set():
                self._io.run(rung(spec, self._token, self._box, wait), action)
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
