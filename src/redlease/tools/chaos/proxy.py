"""A small TCP fault proxy: put one in front of each server to inject network faults.

    proxy = FaultProxy("127.0.0.1", server.port).start()
    client = redis.Redis(port=proxy.port, socket_timeout=0.5)
    proxy.set_mode("delay", delay_ms=200)   # every chunk, both ways, 200 ms late
    proxy.set_mode("blackhole")             # nothing gets through, connections stay open
    proxy.set_mode("drop_replies")          # commands reach the server and are applied;
                                            # their replies are swallowed
    proxy.set_mode("drop_next_reply")       # the same, for one reply chunk only; then pass
    proxy.set_mode("reset")                 # every connection is reset (RST), now and on
                                            # connect, until another mode is set
    proxy.reset_connections()               # one-shot reset; the mode stays as it is
    proxy.retarget("127.0.0.1", other_port) # new connections go there (a moved address)
    proxy.hold_open()                       # the bytes clients send on the connections
                                            # open now are held (new ones pass)...
    proxy.let_go()                          # ...and delivered now, in order
    proxy.set_mode("pass")                  # back to normal
    proxy.stop()

Modes (``MODES``):

- ``pass``: bytes are forwarded both ways as they come.
- ``delay``: each chunk read is forwarded ``delay_ms`` later, in order, in both directions
  (latency, not a bandwidth limit: pipelined chunks do not queue behind each other's delay).
- ``blackhole``: bytes read in either direction are discarded; connections stay open, so
  a client without a socket timeout waits forever (as across a silent partition). Data
  discarded here is gone: a connection that lived through a blackhole is out of step with
  its server, and clients should drop it (redis-py does on a timeout).
- ``drop_replies``: client-to-server bytes are forwarded (commands are applied), server-to-
  client bytes are discarded: "applied, unacknowledged".
- ``drop_next_reply``: like ``drop_replies`` for the next server-to-client chunk only (one
  lost reply), after which the mode goes back to ``pass`` by itself.
- ``reset``: existing connections are aborted with an RST, new ones are reset on accept.

Besides the modes, ``hold_open()`` stalls the connections open at that moment, one way:
what their clients send (a close included) is held until ``let_go()``, while new
connections pass. So a command in flight on a connection its client then drops reaches
the server after what the client sent next on another connection: the order two
connections deliver in is not the order they were written in.

The proxy runs its own asyncio loop in a daemon thread, so it works under sync and async
code alike; ``set_mode`` may be called from any thread and applies to the next chunk read.
It listens on 127.0.0.1 only. ``stats`` counts connections and bytes forwarded/dropped.
Use it as a context manager, or call ``stop()`` (idempotent) in a ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MODES", "FaultProxy", "ProxyStats"]

MODES = ("pass", "delay", "blackhole", "drop_replies", "drop_next_reply", "reset")

_CHUNK = 65536


@dataclass
class ProxyStats:
    connections: int = 0
    resets: int = 0
    bytes_forwarded: int = 0
    bytes_dropped: int = 0
    holding: int = 0  # connections with something held by hold_open() now


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST rather than a FIN (SO_LINGER 0), discarding buffered bytes."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One proxied connection: the client side, the server side, and their pumps."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.tasks: list[asyncio.Task[None]] = []
        self.open = asyncio.Event()  # cleared: what the client sends is held (hold_open)
        self.open.set()

    def abort(self) -> None:
        _abort(self.client)
        _abort(self.server)
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """A TCP proxy from ``127.0.0.1:port`` to ``target_host:target_port`` with switchable
    faults (see the module docstring). ``port=0`` picks a free port; read ``.port``
    after ``start()``."""

    def __init__(self, target_host: str, target_port: int, *, port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = port
        self.stats = ProxyStats()
        self._mode = "pass"
        self._delay = 0.0
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._stopping: asyncio.Event | None = None

    # -- control (any thread) ----------------------------------------------------------

    @property
    def mode(self) -> str:
        return self._mode

    def set_mode(self, mode: str, *, delay_ms: float = 0.0) -> None:
        """Switch faults at run time. ``delay_ms`` is used by the ``delay`` mode only."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if delay_ms < 0:
            raise ValueError("delay_ms must not be negative")
        self._delay = delay_ms / 1000.0
        self._mode = mode
        if mode == "reset":
            self.reset_connections()

    def retarget(self, host: str, port: int) -> None:
        """Send new connections to ``host:port`` (as when an address moves to a promoted
        replica); open ones keep their server until they close or are reset."""
        self.target_host, self.target_port = host, port

    def reset_connections(self) -> None:
        """Abort every open connection with an RST (the mode does not change)."""
        loop = self._loop
        if loop is not None and loop.is_running():
            done = threading.Event()

            def reset_all() -> None:
                for link in list(self._links):
                    link.abort()
                    self.stats.resets += 1
                self._links.clear()
                done.set()

            loop.call_soon_threadsafe(reset_all)
            done.wait(5.0)

    def hold_open(self) -> None:
        """Hold what clients send on the connections open now (a close included) until
        ``let_go()``; connections made later pass."""
        self._on_links(lambda link: link.open.clear())

    def let_go(self) -> None:
        """Deliver, in order, what ``hold_open()`` held, and stop holding."""
        self._on_links(lambda link: link.open.set())

    def _on_links(self, change: Callable[[_Link], None]) -> None:
        loop = self._loop
        if loop is None or not loop.is_running():
            return
        done = threading.Event()

        def each() -> None:
            for link in list(self._links):
                change(link)
            done.set()

        loop.call_soon_threadsafe(each)
        done.wait(5.0)

    def start(self, timeout: float = 10.0) -> FaultProxy:
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(ready, failure), name=f"fault-proxy-{self.target_port}"
        )
        self._thread.daemon = True
        self._thread.start()
        if not ready.wait(timeout):
            self.stop()
            raise RuntimeError("fault proxy did not start")
        if failure:
            self.stop()
            raise RuntimeError("fault proxy failed to start") from failure[0]
        return self

    def stop(self) -> None:
        """Close every connection and the listener; join the thread. Safe to call twice."""
        loop, stopping, thread = self._loop, self._stopping, self._thread
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(stopping.set)
        if thread is not None:
            thread.join(10.0)
        self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop (proxy thread) -------------------------------------------------------

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._main(ready, failure))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            ready.set()

    async def _main(self, ready: threading.Event, failure: list[BaseException]) -> None:
        self._stopping = asyncio.Event()
        try:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        except OSError as exc:
            failure.append(exc)
            ready.set()
            return
        self.port = self._server.sockets[0].getsockname()[1]
        self._loop = asyncio.get_running_loop()
        ready.set()
        try:
            await self._stopping.wait()
        finally:
            self._server.close()
            tasks = []
            for link in list(self._links):
                link.abort()
                tasks.extend(link.tasks)
            self._links.clear()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._server.wait_closed()
            self._loop = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        if self._mode == "reset":
            self.stats.resets += 1
            _abort(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            _abort(writer)  # server down: the client sees the connection fail
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.create_task(self._pump(link, reader, up_writer, replies=False)),
            asyncio.create_task(self._pump(link, up_reader, writer, replies=True)),
        ]
        await asyncio.gather(*link.tasks, return_exceptions=True)
        self._links.discard(link)
        for side in (writer, up_writer):
            side.close()
            with contextlib.suppress(Exception):
                await side.wait_closed()

    async def _pump(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        replies: bool,
    ) -> None:
        """Copy one direction. Chunks go through a queue stamped with their release time
        so a delay adds latency without serialising the chunks behind each other."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        sender = asyncio.create_task(self._send(queue, writer, None if replies else link))
        try:
            while True:
                try:
                    data = await reader.read(_CHUNK)
                except (ConnectionError, OSError):
                    data = b""
                if not data:
                    break
                mode = self._mode
                dropping = mode in ("drop_replies", "drop_next_reply") and replies
                if mode in ("blackhole", "reset") or dropping:
                    if mode == "drop_next_reply":
                        self._mode = "pass"
                    self.stats.bytes_dropped += len(data)
                    continue
                delay = self._delay if mode == "delay" else 0.0
                queue.put_nowait((time.monotonic() + delay, data))
            queue.put_nowait(None)
            await sender
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            # One side is done: take both down (a half-open proxy would hide the close).
            link.client.transport.abort()
            link.server.transport.abort()

    async def _send(
        self,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        writer: asyncio.StreamWriter,
        link: _Link | None,  # the client's side: held while link.open is clear
    ) -> None:
        while True:
            item = await queue.get()
            if link is not None and not link.open.is_set():
                self.stats.holding += 1
                try:
                    await link.open.wait()
                finally:
                    self.stats.holding -= 1
            if item is None:
                return
            release_at, data = item
            wait = release_at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                return
            self.stats.bytes_forwarded += len(data)
