# Generated from _async/hub.py by scripts/unasync.py: edit that file, then run
# `python scripts/unasync.py` (the tests run it with --check).
"""One shared wait connection per server and owner (the process, or an event loop): the
hub. Written once, as asyncio code; ``scripts/unasync.py`` generates the blocking twin
(``_sync.hub``).

A waiter does not hold a connection of its own. The hub of its pool (``Pool.hub``) has
one connection subscribed to the channel of each lock its waiters wait for (the lock's
bell prefix .. "@" .. the hub's id: in the lock's hash slot); the waiter's queue entry
names the hub, and a release rings the waiter by publishing
"token:fence:server_us:taken" there. A reader (a thread, or a task of the loop, which
the loop's shutdown cancels) hands each ring to the waiter of that token (its ``Box``):
waking is targeted, and idle waiters send nothing.

The release first asks how many connections listen on that channel (PUBSUB NUMSUB):
none means the hub's process (or its connection) is gone, and the release drops that
waiter and serves the next at once, instead of granting the lock to a dead waiter for a
whole ttl. It then publishes nothing: a hub left listening on a server that has since
become a replica would still hear a published ring, through replication, and take a
grant that was undone.

Lost rings: when the hub's connection fails, every waiter's box is woken with nothing,
and each waiter looks at the lock again (a grant stays in the lock key, where its next
try finds it) and subscribes again on a new connection. A ring published while the hub
was away drops that waiter from the queue: it queues again at the back.

Channels stay subscribed while a waiter may use them and for LINGER seconds after, so
that a lock waited for over and over costs one SUBSCRIBE, not one per wait. A server
that refuses SUBSCRIBE (an ACL without channel rights) makes the hub step aside: its
waiters wait on doorbells of their own, as without a hub.

On a Redis Cluster a hub serves one node: it listens with SSUBSCRIBE, and a release
rings with SPUBLISH, whose channel is in the lock's slot (sharded pub/sub, Redis 7 and
Valkey 7.2 on: the ring stays on the node that serves the lock, and the count of
listeners, PUBSUB SHARDNUMSUB, is that node's). A sharded hub's id starts with "s",
which tells the scripts to ring it so. When the lock's slot moves to another node
(resharding, failover), the node unsubscribes the hub from its channels (each waiter
there looks again, and finds its lock's new node); a redirection (MOVED, ASK...) in
answer to the hub's own commands makes it start over on a new connection, as if it
had been lost.
"""

from __future__ import annotations

import os
import time
import weakref
from dataclasses import dataclass
from typing import Any

from .._base import fork as _fork
from .._clients.errors import ReplyError
from .._rules.classify import starts_over
from .._wire import resp as _resp
from .._wire.endpoint import ConnectionFailed, ReplyTimedOut
from . import backend as _backend_sync

# An unused channel is unsubscribed after this long.
LINGER = 30.0
# The reader looks for unused channels this often (its read's bound).
SWEEP_EVERY = 10.0


def forget_idle(used: dict[str, float], boxes: Any, subscribed: set[str], now: float) -> list[str]:
    """The channels no waiter (``boxes``' values) has used for LINGER seconds, taken out
    of ``used`` and ``subscribed``: to unsubscribe. One rule for both hubs."""
    in_use = {box.channel for box in boxes.values()}
    idle = [c for c, at in used.items() if c not in in_use and now - at > LINGER]
    for channel in idle:
        del used[channel]
        subscribed.discard(channel)
    return idle


@dataclass(frozen=True)
class Verbs:
    """How a hub subscribes, and what the server sends it: plain or sharded pub/sub."""

    subscribe: str
    unsubscribe: str
    message: bytes
    subscribed: bytes
    unsubscribed: bytes
    id_prefix: str  # "s": the scripts ring this hub with SPUBLISH

    def new_id(self) -> str:
        return self.id_prefix + os.urandom(8).hex()

    def unsubscribe_from(self, channels: list[str]) -> bytes:
        # one command per channel: on a cluster, channels of several slots cannot share one
        return b"".join(_resp.command((self.unsubscribe, c)) for c in channels)


PLAIN = Verbs("SUBSCRIBE", "UNSUBSCRIBE", b"message", b"subscribe", b"unsubscribe", "")
SHARDED = Verbs("SSUBSCRIBE", "SUNSUBSCRIBE", b"smessage", b"ssubscribe", b"sunsubscribe", "s")


class Box:
    """The rings for one waiter token: put by the hub's reader, taken by the waiter."""

    __slots__ = ("__weakref__", "_rings", "channel", "owner", "token")

    def __init__(self, owner: Hub, channel: str, token: str) -> None:
        self.owner = owner
        self._rings = _backend_sync.Mailbox()
        self.channel = channel
        self.token = token

    @property
    def hub(self) -> str:
        return self.owner.id

    @property
    def ready(self) -> bool:
        return self.channel in self.owner.subscribed

    def put(self, ring: bytes | None) -> None:
        self._rings.put(ring)

    def wait(self, timeout: float) -> bytes | None:
        """The next ring ("fence:server_us"), or None: ``timeout`` passed, or the hub's
        connection failed (look at the lock again). A ring lost to a cancellation is
        not missed: a grant stays in the lock key, which the cancelled waiter's clean-up
        gives back."""
        ring: bytes | None = self._rings.get(timeout)
        return ring


class Hub:
    """The shared wait connection of one pool (see the module docstring). ``_lock`` is
    held across its I/O (connecting, subscribing, unsubscribing), ``_guard`` while its
    state changes otherwise (the reader's; a blocking hub's are one thread lock)."""

    def __init__(self, pool: Any, verbs: Verbs = PLAIN) -> None:
        self._pool = pool  # its endpoint and connections' settings
        self.verbs = verbs
        self._lock, self._guard = _backend_sync.hub_locks()
        self._generation = -1
        self._conn: Any = None
        self._reader: Any = None  # kept: a loop holds its tasks weakly
        self._start()
        _fork.renew_in_child(self)

    def _after_fork(self) -> None:
        # The parent's reader may have held a lock at the fork (listen starts the child's
        # hub anew); a task of the parent's loop, awaiting what only its threads finish.
        self._lock, self._guard = _backend_sync.hub_locks()

    def _start(self) -> None:
        """A new hub id and no connection: at creation, and in a forked child (whose
        copy of the parent's socket is closed here, leaving the parent's open)."""
        if self._conn is not None:
            self._conn.close()
        self.id = self.verbs.new_id()
        self.subscribed: set[str] = set()
        self.refused = False  # the server refused SUBSCRIBE: waiters use bells
        self._conn = None
        self._asked: dict[str, _backend_sync.Flag] = {}  # SUBSCRIBEs sent, not yet confirmed
        self._boxes: weakref.WeakValueDictionary[str, Box] = weakref.WeakValueDictionary()
        self._used: dict[str, float] = {}  # channel -> when a box for it was last made
        self._generation = _fork.generation

    def listen(self, prefix: str, token: str) -> Box | None:
        """A box for ``token``'s rings (None once the server refused SUBSCRIBE)."""
        with self._guard:
            if self._generation != _fork.generation:
                self._start()  # the parent's connection and subscriptions are not ours
            if self.refused:
                return None
            channel = prefix + "@" + self.id
            box = Box(self, channel, token)
            self._boxes[token] = box
            self._used[channel] = time.monotonic()
            return box

    def subscribe(self, box: Box, timeout: float) -> Box | None:
        """Listen on ``box``'s channel; the box, or None if the server refuses."""
        channel = box.channel
        if self.refused:
            return None
        if channel in self.subscribed:
            return box
        end = time.monotonic() + timeout
        asked = self._ask(channel, timeout)
        asked.wait(max(end - time.monotonic(), 0.0))
        if not asked.is_set():
            raise ReplyTimedOut(f"SUBSCRIBE not confirmed within {timeout:.3f}s")
        if self.refused:
            return None
        if channel not in self.subscribed:
            raise ConnectionFailed("the shared wait connection was lost")
        return box

    def _ask(self, channel: str, timeout: float) -> _backend_sync.Flag:
        """SUBSCRIBE to ``channel`` (unless already asked): set once confirmed."""
        with self._lock:
            asked = self._asked.get(channel)
            if asked is None:
                if self._conn is None:
                    self._connect(timeout)
                asked = self._asked[channel] = _backend_sync.Flag()
                try:
                    self._conn.send(_resp.command((self.verbs.subscribe, channel)))
                except BaseException:
                    self._asked.pop(channel, None)
                    raise
            return asked

    def _connect(self, timeout: float) -> None:
        """Open the hub's connection and start its reader. Lock held."""
        conn = self._pool.open_connection(timeout)
        self._conn = conn
        self._reader = _backend_sync.start(_read, weakref.ref(self), conn, name="redlease-hub")

    def _heard(self, conn: Any, message: Any) -> None:
        """One message from the server on ``conn``."""
        kind, verbs = message[0], self.verbs
        if kind == verbs.message:
            token, _, ring = message[2].partition(b":")
            box = self._boxes.get(token.decode())
            if box is not None:
                box.put(ring)
        elif kind == verbs.subscribed:
            channel = message[1].decode()
            with self._guard:
                if conn is self._conn:
                    self.subscribed.add(channel)
                asked = self._asked.pop(channel, None)
            if asked is not None:
                asked.set()
        elif kind == verbs.unsubscribed and message[1] is not None:
            # Ours (the sweep's: the channel is already out of ``subscribed``), or the
            # node's: the lock's slot moved away, and its waiters look again.
            channel = message[1].decode()
            with self._guard:
                if conn is not self._conn or channel not in self.subscribed:
                    return
                self.subscribed.discard(channel)
                boxes = [box for box in self._boxes.values() if box.channel == channel]
            for box in boxes:
                box.put(None)

    def _error(self, conn: Any, error: ReplyError) -> bool:
        """The server answered a command of the hub's with an error; False if the hub
        gave up ``conn`` (see ``_rules.classify.starts_over``)."""
        if starts_over(error.code):
            self._lost(conn)
            return False
        self._refused(conn)
        return True

    def _refused(self, conn: Any) -> None:
        """The server answered SUBSCRIBE with an error (no channel rights)."""
        with self._guard:
            if conn is not self._conn:
                return
            self.refused = True
            asked = list(self._asked.values())
            self._asked.clear()
        for flag in asked:
            flag.set()

    def _lost(self, conn: Any) -> None:
        """``conn`` failed: every waiter looks at its lock again."""
        conn.close()
        with self._guard:
            if conn is not self._conn:
                return
            self._conn = None
            self.subscribed.clear()
            asked = list(self._asked.values())
            self._asked.clear()
            boxes = list(self._boxes.values())
        for flag in asked:
            flag.set()
        for box in boxes:
            box.put(None)

    def _sweep(self, conn: Any) -> None:
        """Unsubscribe the channels no waiter has used for LINGER seconds."""
        now = time.monotonic()
        with self._lock:
            if conn is not self._conn:
                return
            idle = forget_idle(self._used, self._boxes, self.subscribed, now)
            if idle:
                conn.send(self.verbs.unsubscribe_from(idle))


def _read(ref: weakref.ReferenceType[Hub], conn: Any) -> None:
    """The hub's reader: hands out what ``conn`` receives until it fails, the hub is
    gone, or (a task) the loop shuts down. It holds the hub only while handling a message."""
    while True:
        try:
            message = conn.read(SWEEP_EVERY, spin=False)
        except ReplyTimedOut:
            hub = ref()
            if hub is None:
                conn.close()
                return
            try:
                hub._sweep(conn)
            except Exception:
                hub._lost(conn)
                return
            del hub
            continue
        except ReplyError as error:
            hub = ref()
            if hub is None:
                conn.close()
                return
            if not hub._error(conn, error):
                return
            del hub
            continue
        except Exception:
            hub = ref()
            if hub is None:
                conn.close()
            else:
                hub._lost(conn)
            return
        hub = ref()
        if hub is None:
            conn.close()
            return
        hub._heard(conn, message)
        del hub
