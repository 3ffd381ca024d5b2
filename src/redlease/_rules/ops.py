"""The operations a flow yields and a driver carries out: run a script, send a command,
take a waiter's rings through the hub, wait for a ring, sleep. The vocabulary between
the rules (``flows``, ``quorum``, ``inspect``, ``election`` here) and the drivers and the
wire (``_async.io``, ``_async.redlock``, ``_wire.resp``): it imports neither side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .._base.timing import SHORTEST_WAIT
from .scripts import Script

# How long past a BLPOP's timeout the driver waits for the server's own answer.
LATE_WAKE = 0.005


@dataclass(frozen=True)
class Replicas:
    """After an op, wait (``WAIT``, on the same connection) until ``count`` replicas have
    its write, for at most ``timeout_ms``; the driver then replies ``(reply, acked)``."""

    count: int
    timeout_ms: int

    def within(self, seconds: float) -> Replicas:
        """This WAIT, cut to ``seconds`` if they are shorter: whole milliseconds, rounded
        down so as not to outlast them, and never 0 (``WAIT`` takes 0 as "forever")."""
        ms = int(max(seconds, SHORTEST_WAIT) * 1000)
        return self if ms >= self.timeout_ms else Replicas(self.count, ms)


# Built on every lock cycle: plain slotted dataclasses (a frozen one costs four times as
# much to build), never changed after construction all the same.
@dataclass(slots=True)
class Call:
    """Run a script (as the wire says: FCALL of its function, or EVALSHA; see _wire.resp)."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[str, ...]
    timeout: float  # seconds a reply is worth waiting for
    replicas: Replicas | None = None
    # False: a connection failure is tried again once, at once, never after the client's
    # retry policy's back-off (a try never waits: see TRY_BOUND)
    patient: bool = True
    # The arguments to send instead when it may be sent twice: again after its reply was
    # lost, or from the first send by a client whose own retries resend it as it is (the
    # first send may have run: a first try that may queue then asks for its place to be
    # searched for); None: the same ones
    again: tuple[str, ...] | None = None


@dataclass(slots=True)
class Command:
    """Send one plain command."""

    args: tuple[str, ...]
    timeout: float
    patient: bool = True  # as Call's


class Mailbox(Protocol):
    """Where a driver's hub (its process's one shared wait connection, subscribed to
    the channels of the locks waited for) puts the rings for one waiter token."""

    token: str

    @property
    def hub(self) -> str:
        """The hub's id, as the waiter's queue entry names it."""

    @property
    def ready(self) -> bool:
        """The hub listens on this lock's channel: a ring published now reaches us."""

    @property
    def pending(self) -> bool:
        """The lock is contended here: another attempt of this process at it is under
        way, or the hub has asked to listen on its channel and the server has not
        confirmed it yet. A try would likely fail: listen first, then queue."""

    def put(self, ring: bytes | None) -> None:
        """Hand the waiter a ring (the hub's reader does); None wakes it to look again."""


@dataclass(slots=True)
class Listen:
    """Have the driver's hub take the rings for ``token`` (a waiter of the lock whose
    bell prefix is ``prefix``); with ``box``, also have it listen on that lock's channel
    (one round trip, the first time: SUBSCRIBE). The reply is the Mailbox, or None when the
    driver has no hub (the waiter then waits on its own bell)."""

    prefix: str
    token: str
    timeout: float
    box: Mailbox | None = None


@dataclass(slots=True)
class Wait:
    """Block on the server (BLPOP) until ``key`` gets an element or ``timeout`` passes;
    with ``box``, until the hub puts a ring there instead (no connection of our own).

    The reply is the popped element, or None on timeout. An idle server notices a
    BLPOP's timeout late (it looks between events, and when idle only every 1/hz s:
    100 ms by default), so the driver ends it itself ``LATE_WAKE`` after ``timeout``:
    None as well, or the ring popped just then. Nothing is lost if such a ring is dropped
    (see the drivers): a grant stays in the lock key, where the next try finds it, and a
    plain wake-up only asks for that try. A wait whose connection fails is None too.
    """

    key: str
    timeout: float
    connect_timeout: float  # a new connection's bound, handshake included
    replicas: Replicas | None = None  # a grant popped from the bell must reach them
    box: Mailbox | None = None

    @property
    def give_up(self) -> float:
        return self.timeout + LATE_WAKE


@dataclass(slots=True)
class Sleep:
    """Sleep before the next try (a retry's delay): no I/O."""

    seconds: float


Op = Call | Command | Listen | Wait | Sleep
