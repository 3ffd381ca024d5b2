"""One warm, uncontended `with` block runs code in at most ten of redlease's modules
(docs/design.md draws them): a reader can follow it from the front to the socket and
back, and a change that adds a module to that path must say so here and there."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import redis
import redis.asyncio as aredis

import redlease
from redlease.tools import servers

PACKAGE = str(Path(redlease.__file__).parent)
AT_MOST = 10


def _recorder(into: set[str]) -> Callable[[FrameType, str, Any], None]:
    def record(frame: FrameType, event: str, arg: Any) -> None:
        path = frame.f_code.co_filename
        if event == "call" and path.startswith(PACKAGE):
            into.add(path[len(PACKAGE) + 1 :])

    return record


@contextlib.contextmanager
def _profiled(into: set[str]) -> Iterator[None]:
    """The modules the block runs code in, into ``into``. The garbage collector is kept
    out: a collection in the block would run the finalizers of other tests' objects
    (an asyncio pool's, in a sync block), which are not the block's path."""
    gc.collect()
    gc.disable()
    sys.setprofile(_recorder(into))
    try:
        yield
    finally:
        sys.setprofile(None)
        gc.enable()


def test_a_warm_with_block_runs_in_ten_modules(server: servers.ServerProcess, name: str) -> None:
    client = redis.Redis(port=server.port)
    lock = redlease.Lock(client, name, ttl=10.0)
    for _ in range(3):  # warm: the connection, the scripts, the hub's subscription
        with lock:
            pass
    modules: set[str] = set()
    with _profiled(modules), lock:
        pass
    assert {"_sync/front.py", "_wire/resp.py"} <= modules, modules
    assert len(modules) <= AT_MOST, sorted(modules)


def test_a_warm_async_with_block_runs_in_ten_modules(
    server: servers.ServerProcess, name: str
) -> None:
    async def run() -> set[str]:
        client = aredis.Redis(port=server.port)
        lock = redlease.AsyncLock(client, name, ttl=10.0)
        for _ in range(3):
            async with lock:
                pass
        modules: set[str] = set()
        with _profiled(modules):
            async with lock:
                pass
        await client.aclose()
        return modules

    modules = asyncio.run(run())
    assert {"_async/front.py", "_wire/resp.py"} <= modules, modules
    assert len(modules) <= AT_MOST, sorted(modules)
