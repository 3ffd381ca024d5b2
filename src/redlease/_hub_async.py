"""One shared wait connection per event loop and server: the hub, asyncio flavour (twin
of ``_hub_sync``, whose docstring says how it works). The reader is a task of the loop;
the loop's shutdown cancels it, which closes the connection."""

from __future__ import annotations

import asyncio
import collections
import time
import weakref
from typing import Any

from . import _fork, _resp
from ._backend_errors import starts_over
from ._endpoint import ConnectionFailed, ReplyTimedOut
from ._hub_sync import PLAIN, SWEEP_EVERY, Verbs, forget_idle


def _set_if_pending(future: asyncio.Future[bytes | None], value: bytes | None) -> None:
    if not future.done():
        future.set_result(value)


class Box:
    """The rings for one waiter token: put by the hub's reader, taken by the waiter."""

    __slots__ = ("__weakref__", "_rings", "_waiter", "channel", "owner", "token")

    def __init__(self, owner: Hub, channel: str, token: str) -> None:
        self.owner = owner
        self._rings: collections.deque[bytes | None] = collections.deque()
        self._waiter: asyncio.Future[bytes | None] | None = None
        self.channel = channel
        self.token = token

    @property
    def hub(self) -> str:
        return self.owner.id

    @property
    def ready(self) -> bool:
        return self.channel in self.owner.subscribed

    def put(self, ring: bytes | None) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(ring)
        else:
            self._rings.append(ring)

    async def wait(self, timeout: float) -> bytes | None:
        """The next ring ("fence:server_us"), or None: ``timeout`` passed, or the hub's
        connection failed (look at the lock again). A ring lost to a cancellation is
        not missed: a grant stays in the lock key, which the cancelled waiter's clean-up
        gives back."""
        if self._rings:
            return self._rings.popleft()
        loop = self.owner.loop
        waiter: asyncio.Future[bytes | None] = loop.create_future()
        self._waiter = waiter
        # A timer, not asyncio.wait_for: before 3.12 that returns a ring that came as
        # the caller was cancelled and drops the cancellation, so a task cancelled then
        # would go on waiting (an endless observer never ends).
        timer = loop.call_later(timeout, _set_if_pending, waiter, None)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiter = None


class Hub:
    """The shared wait connection of one pool (see ``_hub_sync``)."""

    def __init__(self, pool: Any, verbs: Verbs = PLAIN) -> None:
        self._pool = pool  # its endpoint and connections' settings
        self.verbs = verbs
        self.loop: asyncio.AbstractEventLoop = pool.loop
        self._generation = -1
        self._conn: Any = None
        self._start()

    def _start(self) -> None:
        """A new hub id and no connection: at creation, and in a forked child (whose
        copy of the parent's socket is closed here, leaving the parent's open)."""
        if self._conn is not None:
            self._conn.close()
        # New in a child too: a task of the parent's loop may have held it at the fork,
        # awaiting what only the parent's threads finish (an executor's lookup, say).
        self._lock = asyncio.Lock()
        self.id = self.verbs.new_id()
        self.subscribed: set[str] = set()
        self.refused = False  # the server refused SUBSCRIBE: waiters use bells
        self._conn = None
        self._reader: asyncio.Task[None] | None = None  # kept: a loop holds tasks weakly
        self._asked: dict[str, asyncio.Future[None]] = {}  # SUBSCRIBEs not yet confirmed
        self._boxes: weakref.WeakValueDictionary[str, Box] = weakref.WeakValueDictionary()
        self._used: dict[str, float] = {}  # channel -> when a box for it was last made
        self._generation = _fork.generation

    def listen(self, prefix: str, token: str) -> Box | None:
        """A box for ``token``'s rings (None once the server refused SUBSCRIBE)."""
        if self._generation != _fork.generation:
            self._start()  # the parent's connection and subscriptions are not ours
        if self.refused:
            return None
        channel = prefix + "@" + self.id
        box = Box(self, channel, token)
        self._boxes[token] = box
        self._used[channel] = time.monotonic()
        return box

    async def subscribe(self, box: Box, timeout: float) -> Box | None:
        """Listen on ``box``'s channel; the box, or None if the server refuses."""
        channel = box.channel
        if self.refused:
            return None
        if channel in self.subscribed:
            return box
        try:
            await asyncio.wait_for(self._ask(channel, timeout), timeout)
        except asyncio.TimeoutError:
            raise ReplyTimedOut(f"SUBSCRIBE not confirmed within {timeout:.3f}s") from None
        if self.refused:
            return None
        if channel not in self.subscribed:
            raise ConnectionFailed("the shared wait connection was lost")
        return box

    async def _ask(self, channel: str, timeout: float) -> None:
        """SUBSCRIBE to ``channel`` (unless already asked), until confirmed."""
        async with self._lock:
            asked = self._asked.get(channel)
            if asked is None:
                if self._conn is None:
                    await self._connect(timeout)
                asked = self._asked[channel] = self.loop.create_future()
                try:
                    await self._conn.send(_resp.command((self.verbs.subscribe, channel)))
                except BaseException:
                    self._asked.pop(channel, None)
                    raise
        await asyncio.shield(asked)

    async def _connect(self, timeout: float) -> None:
        """Open the hub's connection and start its reader. Lock held."""
        conn = await self._pool.open_connection(timeout)
        self._conn = conn
        self._reader = self.loop.create_task(_read(weakref.ref(self), conn))

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
            if conn is self._conn:
                self.subscribed.add(channel)
            asked = self._asked.pop(channel, None)
            if asked is not None and not asked.done():
                asked.set_result(None)
        elif kind == verbs.unsubscribed and message[1] is not None:
            # Ours (the sweep's: the channel is already out of ``subscribed``), or the
            # node's: the lock's slot moved away, and its waiters look again.
            channel = message[1].decode()
            if conn is not self._conn or channel not in self.subscribed:
                return
            self.subscribed.discard(channel)
            for box in [box for box in self._boxes.values() if box.channel == channel]:
                box.put(None)

    def _error(self, conn: Any, error: _resp.ReplyError) -> bool:
        """The server answered a command of the hub's with an error; False if the hub
        gave up ``conn`` (see ``_backend_errors.starts_over``)."""
        if starts_over(error):
            self._lost(conn)
            return False
        self._refused(conn)
        return True

    def _refused(self, conn: Any) -> None:
        """The server answered SUBSCRIBE with an error (no channel rights)."""
        if conn is not self._conn:
            return
        self.refused = True
        asked = list(self._asked.values())
        self._asked.clear()
        for future in asked:
            if not future.done():
                future.set_result(None)

    def _lost(self, conn: Any) -> None:
        """``conn`` failed: every waiter looks at its lock again."""
        conn.close()
        if conn is not self._conn:
            return
        self._conn = None
        self.subscribed.clear()
        asked = list(self._asked.values())
        self._asked.clear()
        for future in asked:
            if not future.done():
                future.set_result(None)
        for box in list(self._boxes.values()):
            box.put(None)

    async def _sweep(self, conn: Any) -> None:
        """Unsubscribe the channels no waiter has used for LINGER seconds."""
        now = time.monotonic()
        if conn is not self._conn:
            return
        idle = forget_idle(self._used, self._boxes, self.subscribed, now)
        if idle:
            await conn.send(self.verbs.unsubscribe_from(idle))


async def _read(ref: weakref.ReferenceType[Hub], conn: Any) -> None:
    """The hub's reader task: hands out what ``conn`` receives until it fails, the hub
    is gone, or the loop shuts down. It holds the hub only while handling a message."""
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
        except _resp.ReplyError as error:
            hub = ref()
            if hub is None:
                conn.close()
                return
            if not hub._error(conn, error):
                return
            del hub
            continue
        except asyncio.CancelledError:
            conn.close()
            raise
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
