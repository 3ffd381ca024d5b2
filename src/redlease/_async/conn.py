"""redlease's own connections to one server: their bounded pool, and the hub, its one
shared wait connection. Written once, as asyncio code; ``scripts/unasync.py`` generates
the blocking twin (``_sync.conn``).

A ``Pool`` per server and owner (``pool_for``: the process for blocking code, each event
loop for asyncio) keeps them: at most MAX_CONNECTIONS, of which blocking waits may hold
all but RESERVED (so a release always finds one), MAX_IDLE kept open between uses. They
are never the application's: its pool's limit is neither used nor exceeded on
redlease's account. A connection taken from the idle list is checked first, without a
round trip, and replaced if the server closed it (an idle ``timeout``, ``CLIENT KILL``, a
restart). After ``fork`` the child never uses its parent's sockets: the pool notices the
new process id and starts empty. asyncio connections belong to one loop, and a loop's
shutdown closes its idle ones. A pool counts its connections by weak reference, not by a
tally every caller must keep straight: one dropped without being given back (an
exception a signal handler raised between two steps) closes itself and no longer counts.

Two kinds of connection (see ``_wire.endpoint``): ``SocketConnection``, a socket of our own
read with hiredis (or ``_wire.resp.PyReader``), and ``ClassConnection``, one made with the
client's own connection class and used through its public methods (in the backend: its
methods are the flavour's). A reply due in about a round trip is first polled for (see
``_wire.resp``); how a read then waits (SO_RCVTIMEO, or the loop with a shared timer) is the
backend's ``SocketWait``.

The hub: one shared wait connection per server and owner (the process, or an event
loop). A waiter does not hold a connection of its own. The hub of its pool (``Pool.hub``) has
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

import contextlib
import functools
import os
import select
import socket
import time
import weakref
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from .._base import fork as _fork
from .._base.timing import SHORTEST_WAIT
from .._clients import ConnectionFailed, ReplyTimedOut
from .._clients.errors import ReplyError
from .._rules.classify import starts_over
from .._wire import resp as _resp
from .._wire import stale as _stale
from .._wire.endpoint import Endpoint, Route, node_endpoint
from .._wire.resp import buffered
from . import backend as _backend
from .backend import ClassConnection

# --------------------------------------------------------------------------- the hub

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

    __slots__ = ("__weakref__", "_rings", "channel", "contended", "owner", "token")

    def __init__(self, owner: Hub, channel: str, token: str, contended: bool = False) -> None:
        self.owner = owner
        self._rings = _backend.RingQueue()
        self.channel = channel
        self.token = token
        # another attempt of this process at this lock is under way (its box still
        # lives): the lock is contended, and a try first would likely fail
        self.contended = contended

    @property
    def hub(self) -> str:
        return self.owner.id

    @property
    def ready(self) -> bool:
        return self.channel in self.owner.subscribed

    @property
    def pending(self) -> bool:
        return self.contended or self.channel in self.owner.asked

    def put(self, ring: bytes | None) -> None:
        self._rings.put(ring)

    async def wait(self, timeout: float) -> bytes | None:
        """The next ring ("fence:server_us"), or None: ``timeout`` passed, or the hub's
        connection failed (look at the lock again). A ring lost to a cancellation is
        not missed: a grant stays in the lock key, which the cancelled waiter's clean-up
        gives back."""
        ring: bytes | None = await self._rings.get(timeout)
        return ring


class Hub:
    """The shared wait connection of one pool (see the module docstring). ``_lock`` is
    held across its I/O (connecting, subscribing, unsubscribing), ``_guard`` while its
    state changes otherwise (the reader's; a blocking hub's are one thread lock)."""

    def __init__(self, pool: Any, verbs: Verbs = PLAIN) -> None:
        self._pool = pool  # its endpoint and connections' settings
        self.verbs = verbs
        self._lock, self._guard = _backend.hub_locks()
        self._generation = -1
        self._conn: Any = None
        self._reader: Any = None  # kept: a loop holds its tasks weakly
        self._start()
        _fork.renew_in_child(self._after_fork)

    def _after_fork(self) -> None:
        # The parent's reader may have held a lock at the fork (listen starts the child's
        # hub anew); a task of the parent's loop, awaiting what only its threads finish.
        self._lock, self._guard = _backend.hub_locks()

    def _start(self) -> None:
        """A new hub id and no connection: at creation, and in a forked child (whose
        copy of the parent's socket is closed here, leaving the parent's open)."""
        if self._conn is not None:
            self._conn.close()
        self.id = self.verbs.new_id()
        self.subscribed: set[str] = set()
        self.refused = False  # the server refused SUBSCRIBE: waiters use bells
        self._conn = None
        self.asked: dict[str, _backend.Flag] = {}  # SUBSCRIBEs sent, not yet confirmed
        self._boxes: weakref.WeakValueDictionary[str, Box] = weakref.WeakValueDictionary()
        self._used: dict[str, float] = {}  # channel -> when a box for it was last made
        self._latest: dict[str, weakref.ReferenceType[Box]] = {}  # channel -> that box
        self._generation = _fork.generation

    def listen(self, prefix: str, token: str) -> Box | None:
        """A box for ``token``'s rings (None once the server refused SUBSCRIBE)."""
        with self._guard:
            if self._generation != _fork.generation:
                self._start()  # the parent's connection and subscriptions are not ours
            if self.refused:
                return None
            channel = prefix + "@" + self.id
            latest = self._latest.get(channel)
            box = Box(self, channel, token, latest is not None and latest() is not None)
            self._boxes[token] = box
            self._used[channel] = time.monotonic()
            self._latest[channel] = weakref.ref(box)
            return box

    async def subscribe(self, box: Box, timeout: float) -> Box | None:
        """Listen on ``box``'s channel; the box, or None if the server refuses."""
        channel = box.channel
        if self.refused:
            return None
        if channel in self.subscribed:
            return box
        end = time.monotonic() + timeout
        asked = await self._ask(channel, timeout)
        if asked is not None:
            await asked.wait(max(end - time.monotonic(), 0.0))
            if not asked.is_set():
                raise ReplyTimedOut(f"SUBSCRIBE not confirmed within {timeout:.3f}s")
        if self.refused:
            return None
        if channel not in self.subscribed:
            raise ConnectionFailed("the shared wait connection was lost")
        return box

    async def _ask(self, channel: str, timeout: float) -> _backend.Flag | None:
        """SUBSCRIBE to ``channel`` (unless already asked): set once confirmed; None if
        it was confirmed while this caller waited for the lock (a burst of waiters for
        one new channel sends one SUBSCRIBE, not one each)."""
        async with self._lock:
            if channel in self.subscribed:
                return None
            asked = self.asked.get(channel)
            if asked is None:
                if self._conn is None:
                    await self._connect(timeout)
                asked = self.asked[channel] = _backend.Flag()
                try:
                    await self._conn.send(_resp.command((self.verbs.subscribe, channel)))
                except BaseException:
                    self.asked.pop(channel, None)
                    raise
            return asked

    async def _connect(self, timeout: float) -> None:
        """Open the hub's connection and start its reader. Lock held."""
        conn = await self._pool.open_connection(timeout)
        self._conn = conn
        self._reader = _backend.start(_read, weakref.ref(self), conn, name="redlease-hub")

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
                asked = self.asked.pop(channel, None)
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
            asked = list(self.asked.values())
            self.asked.clear()
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
            asked = list(self.asked.values())
            self.asked.clear()
            boxes = list(self._boxes.values())
        for flag in asked:
            flag.set()
        for box in boxes:
            box.put(None)

    async def _sweep(self, conn: Any) -> None:
        """Unsubscribe the channels no waiter has used for LINGER seconds."""
        now = time.monotonic()
        async with self._lock:
            if conn is not self._conn:
                return
            idle = forget_idle(self._used, self._boxes, self.subscribed, now)
            for channel in idle:
                self._latest.pop(channel, None)
            if idle:
                await conn.send(self.verbs.unsubscribe_from(idle))


async def _read(ref: weakref.ReferenceType[Hub], conn: Any) -> None:
    """The hub's reader: hands out what ``conn`` receives until it fails, the hub is
    gone, or (a task) the loop shuts down. It holds the hub only while handling a message."""
    while True:
        try:
            message = await conn.read(SWEEP_EVERY, spin=False)
        except ReplyTimedOut:
            hub = ref()
            if hub is None:
                conn.close()
                return
            try:
                await hub._sweep(conn)
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
        # unasync: async only
        except _backend.Cancelled:
            conn.close()
            raise
        # unasync: end
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


# --------------------------------------------------------------------------- the pool

MAX_CONNECTIONS = 128
# (combined once: a socket flag is an enum member, and combining two costs calls each time)
PEEK_FLAGS = socket.MSG_PEEK | socket.MSG_DONTWAIT
RESERVED = 16  # never held by blocking waits: short commands always find a connection
MAX_IDLE = 8
# A connection owing the reply of a wait that was given up on (the server answers a
# BLPOP's timeout late when idle) is set aside until that reply comes, at most this long.
OWED_REPLY_LIMIT = 1.0
# A caller waiting for a connection is woken by the give-back that frees one, first come
# first woken. Two frees come with no give-back to tell it: an owed reply that arrives;
# and a slot freed while the first in line is a blocking wait at its limit, which cannot
# take it (the wake is its). While either may be, waiting callers look again this often.
RECHECK = 0.01

NOT_ENOUGH = _resp.NOT_ENOUGH


class SocketConnection:
    """A plain TCP or Unix socket of our own. A write is one ``send``, a read a short
    poll (see ``_wire.resp``) and then the backend's wait. ``stale``: replies owed to fan-outs
    that did not wait for them (see ``_rules.quorum``), dropped before the next reply is read."""

    lean = True
    __slots__ = (
        "__weakref__",  # (a pool counts its connections weakly)
        "buffer",
        "client_id",
        "poller",
        "reader",
        "recv",
        "sendall",
        "sock",
        "spin",
        "stale",
        "waits",
        "wire",
    )

    def __init__(self, sock: socket.socket, pool: Pool) -> None:
        self.sock = sock
        self.buffer = bytearray(65536)
        self.reader = _resp.new_reader()
        self.recv = functools.partial(sock.recv_into, self.buffer, 0, _backend.RECV_FLAGS)
        self.sendall = _backend.sender(sock)
        self.waits = _backend.SocketWait(sock)
        self.spin, self.wire = pool.spin, pool.wire
        self.stale = 0
        self.client_id: int | None = None  # the server's id for it, once asked (CLIENT ID)
        self.poller = select.poll()  # whether anything arrived (see alive)
        self.poller.register(sock, select.POLLIN)

    @classmethod
    async def open(cls, endpoint: Endpoint, timeout: float, pool: Pool) -> SocketConnection:
        limit = endpoint.connect_timeout
        bound = timeout if limit is None else min(limit, timeout)
        try:
            sock = await _backend.connect(endpoint, bound)
        except _backend.TimedOut as exc:
            raise ReplyTimedOut(f"no connection to {endpoint.label} within {bound:.3f}s") from exc
        except OSError as exc:
            raise ConnectionFailed(f"cannot connect to {endpoint.label}: {exc}") from exc
        if not endpoint.path:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if endpoint.keepalive:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                for option, value in endpoint.keepalive_options.items():
                    sock.setsockopt(socket.IPPROTO_TCP, option, value)
        conn = cls(sock, pool)
        try:
            await conn._handshake(endpoint, bound)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _handshake(self, endpoint: Endpoint, timeout: float) -> None:
        """AUTH, SELECT and CLIENT SETNAME as configured, in one write."""
        commands: list[tuple[str, ...]] = []
        credentials = endpoint.credentials()
        if credentials:
            commands.append(("AUTH", *credentials))
        if endpoint.db:
            commands.append(("SELECT", str(endpoint.db)))
        if endpoint.client_name:
            commands.append(("CLIENT", "SETNAME", endpoint.client_name))
        if not commands:
            return
        await self.send(b"".join(_resp.command(c) for c in commands))
        for _ in commands:
            await self.read(timeout, spin=False)

    def alive(self) -> bool:
        """Nothing known to be wrong: the server has not closed it, and sent nothing
        unasked (without a round trip: a poll, then a peek at what arrived, if any)."""
        if not self.poller.poll(0):
            return True
        try:
            data = self.sock.recv(1, PEEK_FLAGS)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return bool(data) and self.stale > 0

    async def send(self, data: bytes) -> None:
        try:
            await self.sendall(data)
        except BlockingIOError:  # a blocking socket's write bound passed
            raise ReplyTimedOut("timed out writing to the server") from None
        except OSError as exc:
            raise ConnectionFailed(f"error while writing: {exc}") from exc

    async def read(self, timeout: float, spin: bool = True) -> Any:
        """The next reply, within ``timeout``; ``spin``: it is due in about a round trip
        (not a blocking command's reply). An error reply is raised as ReplyError."""
        if self.stale:
            timeout = await self._drop_stale(timeout)
        reply = await self._next(timeout, spin)
        if isinstance(reply, ReplyError):
            raise reply
        return reply

    async def _drop_stale(self, timeout: float) -> float:
        """Read the stale replies and drop them; the time left of ``timeout``."""
        clock = time.perf_counter
        end = clock() + timeout
        while self.stale:
            reply = await self._next(max(end - clock(), SHORTEST_WAIT), True)
            _stale.dropped(reply, self.wire.heard)
            self.stale -= 1
        return max(end - clock(), SHORTEST_WAIT)

    def drop_arrived(self) -> Exception | None:
        """Drop the stale replies already received, without waiting; the error if the
        connection failed."""
        try:
            self.stale = _stale.drop_arrived(
                self.recv, self.buffer, self.reader, self.stale, self.wire.heard
            )
        except ConnectionFailed as exc:
            return exc
        return None

    async def _next(self, timeout: float, spin: bool) -> Any:
        """The next reply as parsed (an error reply is returned, not raised)."""
        reader = self.reader
        reply = buffered(reader)
        if reply is NOT_ENOUGH:
            if spin and _resp.BUDGET > 0:
                started = time.perf_counter()
                reply = await _backend.poll(self.recv, self.buffer, reader, self.spin)
                if reply is not NOT_ENOUGH:
                    return reply
                # what the spin took counts against the bound
                timeout = max(timeout - (time.perf_counter() - started), SHORTEST_WAIT)
            reply = await self.waits.read(self.buffer, reader, self.spin, timeout)
        return reply

    def close(self) -> None:
        self.waits.close()
        with contextlib.suppress(OSError):
            self.sock.close()

    def __del__(self) -> None:
        # Dropped without being given back or closed (see the module docstring).
        with contextlib.suppress(Exception):
            self.close()

    # unasync: async only
    async def shut(self) -> None:
        """Close it, from the loop (as at its shutdown)."""
        self.close()

    # unasync: end


Connection = SocketConnection | ClassConnection


class _Opening:
    """A connection's place in its pool's count while it is being opened."""

    __slots__ = ("__weakref__",)


class Pool:
    """redlease's connections to one server, for one owner (see the module docstring).
    Threads share a blocking pool: ``_guard`` guards its lists and counts."""

    def __init__(self, endpoint: Endpoint, hub_verbs: Verbs = PLAIN) -> None:
        self.endpoint = endpoint
        self.owner = _backend.pool_owner()
        self.hub_verbs = hub_verbs  # sharded pub/sub for a Cluster node
        self._open = (
            SocketConnection.open if endpoint.route is Route.SOCKET else ClassConnection.open
        )
        self.wire = _resp.Wire()  # each op as bytes for this server
        self.spin = _resp.SpinRecord()  # whether reads from this server poll before sleeping
        self._guard = _backend.Guard()
        self._freed = _backend.Freed(self._guard)
        self._idle: list[Connection] = []
        self._owing: list[tuple[Connection, float]] = []  # (conn, give up on it at)
        # Connections open (idle, owing or in use) and slots of ones being opened; of
        # them, those held by blocking waits. Weak: what is dropped no longer counts.
        self._open_ones: weakref.WeakSet[object] = weakref.WeakSet()
        self._waits: weakref.WeakSet[object] = weakref.WeakSet()
        self._waiting = 0  # callers waiting for a connection to be freed
        self._at_limit = 0  # of them, blocking waits at their limit (see RECHECK)
        self._generation = _fork.generation
        self._hub: Hub | None = None
        self._shutdown: AsyncGenerator[None, None] | None = None  # unasync: async only
        weakref.finalize(self, _close_all, self._idle, self._owing)
        _fork.renew_in_child(self._after_fork)

    def _after_fork(self) -> None:
        # Another thread of the parent may have held the guard at the fork; the rest of
        # the child's start (forgetting the parent's sockets) waits for its first take.
        self._guard = _backend.Guard()
        self._freed = _backend.Freed(self._guard)
        self._waiting = self._at_limit = 0  # (the parent's waiters are not here)

    # unasync: async only
    async def _closed_at_shutdown(self) -> AsyncGenerator[None, None]:
        """Suspended for the loop's life: the loop closes its async generators when it
        shuts down (``asyncio.run``, ``asyncio.Runner``), and this one then closes the
        idle connections, as only the loop can (a transport cannot close without it)."""
        try:
            yield
        finally:
            idle, owing = list(self._idle), [conn for conn, _ in self._owing]
            self._idle.clear()
            self._owing.clear()
            for conn in idle + owing:
                self._open_ones.discard(conn)
                await conn.shut()

    # unasync: end
    def current(self) -> bool:
        """Whether this pool is the caller's (a blocking one always is: after a fork it
        starts over by itself; each event loop has pools of its own)."""
        return self.owner is _backend.pool_owner()

    @property
    def hub(self) -> Hub | None:
        """The owner's shared wait connection to this server (see the hub, above), for
        sockets of our own (a connection class's methods are not for two threads)."""
        if self._hub is None and self.endpoint.route is Route.SOCKET:
            with self._guard:
                if self._hub is None:
                    self._hub = Hub(self, self.hub_verbs)
        return self._hub

    async def open_connection(self, timeout: float) -> Connection:
        """A new connection, not one of the pool's (the hub's)."""
        return await self._open(self.endpoint, timeout, self)

    async def take(self, timeout: float, *, blocking: bool = False) -> Connection | None:
        """A connection, within ``timeout``: an idle one still alive, or a new one. For a
        ``blocking`` wait, None if none can be spared within ``timeout``."""
        idle = self._idle
        if not blocking and not self._owing and self._generation == _fork.generation:
            # The hot path, without the guard: list.pop is atomic.
            while idle:
                try:
                    conn = idle.pop()
                except IndexError:
                    break
                if conn.alive():
                    return conn
                with self._guard:
                    self._dead(conn)
        # unasync: async only
        if self._shutdown is None:
            self._shutdown = self._closed_at_shutdown()
            await self._shutdown.__anext__()
        # unasync: end
        with self._guard:
            if self._generation != _fork.generation:
                self._forget_parents()
            end = time.monotonic() + timeout
            # Counted before each look, as a give on the hot path reads it after it puts
            # its connection back: one of the two sees the other.
            self._waiting += 1
            try:
                while True:
                    found = self._idle_one()
                    if found is not None:
                        if blocking:
                            self._waits.add(found)
                        return found
                    count = len(self._open_ones)
                    limit = MAX_CONNECTIONS - RESERVED if blocking else MAX_CONNECTIONS
                    in_use = len(self._waits) if blocking else count
                    if in_use < limit and count < MAX_CONNECTIONS:
                        break
                    left = end - time.monotonic()
                    if left <= 0:
                        self._pass_turn()
                        if blocking:
                            return None
                        raise ReplyTimedOut(
                            f"all {MAX_CONNECTIONS} of redlease's connections to "
                            f"{self.endpoint.label} stayed busy for {timeout:.3f}s"
                        )
                    at_limit = blocking and count < MAX_CONNECTIONS
                    self._at_limit += at_limit
                    try:
                        unseen = self._owing or self._at_limit
                        await self._freed.wait(min(left, RECHECK) if unseen else left)
                    finally:
                        self._at_limit -= at_limit
            except BaseException:
                self._pass_turn()  # (interrupted: a wake it was given goes on)
                raise
            finally:
                self._waiting -= 1
            slot = _Opening()  # counts while this caller opens (and holds it)
            self._open_ones.add(slot)
            if blocking:
                self._waits.add(slot)
        try:
            conn = await self._open(self.endpoint, timeout, self)
        except BaseException:
            self._gone(slot)
            raise
        self._open_ones.add(conn)
        if blocking:
            self._waits.add(conn)
        return conn

    def _dead(self, conn: Connection) -> None:
        """``conn`` was found closed by the server: it goes, and the scripts with it (the
        server may have restarted without them). Guard held."""
        conn.close()
        self._open_ones.discard(conn)
        self.wire.closed()

    def _idle_one(self) -> Connection | None:
        """An idle connection still alive (the dead ones closed), or None. Guard held."""
        if self._owing:
            self._settle_owing()
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.alive():
                return conn
            self._dead(conn)
        return None

    def _settle_owing(self) -> None:
        now = time.monotonic()
        for entry in list(self._owing):
            conn, until = entry
            failure = conn.drop_arrived()
            if failure is None and not conn.stale:
                self._owing.remove(entry)
                self._idle.append(conn)
            elif failure is not None or now >= until:
                self._owing.remove(entry)
                conn.close()
                self._open_ones.discard(conn)

    def _pass_turn(self) -> None:
        """A caller leaves without a connection: a wake it may have been given as it
        left goes to the next one (who looks, and waits again if there is nothing).
        Guard held."""
        if self._waiting > 1:
            self._freed.notify()

    def give(self, conn: Connection, *, blocking: bool = False) -> None:
        """Take back ``conn``, its replies read in full (or owed: see ``owe``), and wake
        the first caller waiting for one."""
        if not blocking and self._generation == _fork.generation and len(self._idle) < MAX_IDLE:
            self._idle.append(conn)  # the hot path: list.append is atomic
            if self._waiting:  # (read after the append: see take)
                with self._guard:
                    self._freed.notify()
            return
        with self._guard:
            if blocking:
                self._waits.discard(conn)
            # Kept for a caller waiting for one, whatever MAX_IDLE says: closing it would
            # only make that caller open another (a burst of tasks churned hundreds).
            keep = len(self._idle) < MAX_IDLE or self._waiting
            if self._generation == _fork.generation and keep:
                self._idle.append(conn)
            else:
                conn.close()
                self._open_ones.discard(conn)
            self._freed.notify()

    def owe(self, conn: Connection, *, blocking: bool = False) -> None:
        """Take back ``conn``, which owes one reply still on its way (a wait given up
        on): it is reused once that reply came and was dropped."""
        if not isinstance(conn, SocketConnection):
            self.discard(conn, blocking=blocking)
            return
        conn.stale += 1
        with self._guard:
            if blocking:
                self._waits.discard(conn)
            self._owing.append((conn, time.monotonic() + OWED_REPLY_LIMIT))
            self._freed.notify()

    def discard(self, conn: Connection, *, blocking: bool = False) -> None:
        """Close ``conn``, whose state is unknown (a reply may still be on its way)."""
        conn.close()
        self.wire.forget()  # the server may have restarted without its scripts
        self._gone(conn)

    def _gone(self, conn: object) -> None:
        with self._guard:
            self._open_ones.discard(conn)
            self._waits.discard(conn)
            self._freed.notify()

    def _forget_parents(self) -> None:
        """In a forked child: the parent's sockets are closed here (which leaves them
        open in the parent) and never used. Guard held."""
        for conn in self._idle:
            conn.close()
        for conn, _ in self._owing:
            conn.close()
        self._idle.clear()
        self._owing.clear()
        self._open_ones.clear()
        self._waits.clear()
        self._generation = _fork.generation

    def idle_connections(self) -> list[Connection]:
        """The idle connections, in the order they would be taken last to first."""
        return list(self._idle)


def _close_all(idle: list[Connection], owing: list[tuple[Connection, float]]) -> None:
    for conn in idle:
        conn.close()
    for conn, _ in owing:
        conn.close()


# client's own connection pool -> owner -> pool
_POOLS: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, Pool]] = (
    weakref.WeakKeyDictionary()
)
# A Cluster client -> owner -> node name -> pool for the node's hub only (commands go
# through the client, which routes them).
_NODE_POOLS: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, dict[str, Pool]]] = (
    weakref.WeakKeyDictionary()
)
_POOLS_GUARD = _backend.Guard()


def _new_pools_guard() -> None:
    # Another thread of the parent may have held it at the fork.
    global _POOLS_GUARD
    _POOLS_GUARD = _backend.Guard()


_fork.in_child(_new_pools_guard)


def pool_for(client: Any, endpoint: Endpoint) -> Pool:
    """The caller's pool of redlease's connections to ``client``'s server, shared by
    every lock on that client: it lives as long as the client's own connection pool."""
    owner = _backend.pool_owner()
    with _POOLS_GUARD:
        per_owner = _POOLS.get(client.connection_pool)
        if per_owner is None:
            per_owner = _POOLS[client.connection_pool] = weakref.WeakKeyDictionary()
        pool = per_owner.get(owner)
        if pool is None:
            pool = per_owner[owner] = Pool(endpoint)
        return pool


def node_pool(client: Any, node: Any) -> Pool | None:
    """The caller's pool (for its hub, sharded) of ``node``, a node of the Cluster
    ``client``; None while redlease cannot open sockets of its own to it (TLS, or its
    settings not known yet: asked again next time)."""
    owner = _backend.pool_owner()
    with _POOLS_GUARD:
        per_owner = _NODE_POOLS.get(client)
        if per_owner is None:
            per_owner = _NODE_POOLS[client] = weakref.WeakKeyDictionary()
        nodes = per_owner.get(owner)
        if nodes is None:
            nodes = per_owner[owner] = {}
        pool = nodes.get(node.name)
        if pool is None:
            endpoint = node_endpoint(client, node, asyncio=_backend.ASYNC)
            if endpoint.route is not Route.SOCKET:
                return None
            pool = nodes[node.name] = Pool(endpoint, SHARDED)
        return pool
