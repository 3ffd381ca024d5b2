"""Run one behaviour suite against both twins: the asyncio classes are driven from a
plain thread through a small portal (an event loop in a background thread), so every
test is written once, against the sync surface."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, TypeVar

import redis
import redis.asyncio as aredis

import redlease
from families import FAMILIES, ClientFamily

T = TypeVar("T")


class Portal:
    """An event loop in a daemon thread; ``call`` runs a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, **kw: Any) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(fn(*args, **kw), self.loop)
        return future.result(timeout=60)

    def close(self) -> None:
        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # as asyncio.run does
            await asyncio.get_running_loop().shutdown_asyncgens()

        self.call(shutdown)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class AsyncLeaseView:
    """The sync face of an AsyncLease."""

    def __init__(self, portal: Portal, lease: redlease.AsyncLease) -> None:
        self.portal, self.inner = portal, lease

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def remaining(self) -> float:
        return self.inner.remaining()

    def check(self) -> None:
        self.inner.check()

    def extend(self, ttl: float | None = None) -> None:
        self.portal.call(self.inner.extend, ttl)

    def release(self) -> None:
        self.portal.call(self.inner.release)

    def abandon(self) -> None:  # (a scheduled job's run)
        run = self.inner
        assert isinstance(run, redlease.AsyncRun)
        self.portal.call(run.abandon)


class AsyncLockView:
    """The sync face of an AsyncLock (or AsyncSemaphore)."""

    def __init__(self, portal: Portal, lock: Any) -> None:
        self.portal, self.inner = portal, lock
        self._blocks = threading.local()  # per thread: the open `with` blocks

    def acquire(self, timeout: float | None = None) -> AsyncLeaseView:
        return AsyncLeaseView(self.portal, self.portal.call(self.inner.acquire, timeout))

    def try_acquire(self) -> AsyncLeaseView | None:
        lease = self.portal.call(self.inner.try_acquire)
        return None if lease is None else AsyncLeaseView(self.portal, lease)

    def __enter__(self) -> AsyncLeaseView:
        # `async with` enters and exits in one task; keep one task open across the block.
        entered: Future[redlease.AsyncLease] = Future()
        exit_info: Future[tuple[Any, ...]] = Future()

        async def hold() -> None:
            try:
                async with self.inner as lease:
                    entered.set_result(lease)
                    exc_info = await asyncio.wrap_future(exit_info)
                    if exc_info[1] is not None:
                        raise exc_info[1]
            except BaseException as exc:
                if not entered.done():
                    entered.set_exception(exc)
                raise

        task = asyncio.run_coroutine_threadsafe(hold(), self.portal.loop)
        lease = entered.result(timeout=60)
        self._blocks.__dict__.setdefault("stack", []).append((task, exit_info))
        return AsyncLeaseView(self.portal, lease)

    def __exit__(self, *exc: Any) -> None:
        task, exit_info = self._blocks.stack.pop()
        exit_info.set_result(exc)
        try:
            task.result(timeout=60)
        except BaseException as raised:
            if raised is not exc[1]:
                raise


class AsyncOnceView:
    """The sync face of an AsyncOnce: ``begin``, ``locked`` and the decorator (of a plain
    function, run inside an ``async def`` job)."""

    def __init__(self, portal: Portal, job: redlease.AsyncOnce) -> None:
        self.portal, self.inner = portal, job
        self.name = job.name

    def begin(self) -> Any:
        run = self.portal.call(self.inner.begin)
        return run if isinstance(run, redlease.Skipped) else AsyncLeaseView(self.portal, run)

    def locked(self) -> bool:
        return self.portal.call(self.inner.locked)

    def __call__(self, fn: Callable[..., T]) -> Callable[..., Any]:
        async def job(*args: Any, **kwargs: Any) -> T:
            return fn(*args, **kwargs)

        decorated = self.inner(job)
        return lambda *args, **kwargs: self.portal.call(decorated, *args, **kwargs)


class SyncTwin:
    kind = "sync"

    def __init__(self, port: int, family: ClientFamily = FAMILIES["redis-py"]) -> None:
        self.client: redis.Redis = family.client(port=port)

    def lock(self, name: str, ttl: float = 10.0, **options: Any) -> Any:
        return redlease.Lock(self.client, name, ttl, **options)

    def semaphore(self, name: str, limit: int, ttl: float = 10.0, **options: Any) -> Any:
        return redlease.Semaphore(self.client, name, limit, ttl, **options)

    def rwlock(self, name: str, ttl: float = 10.0, **options: Any) -> Any:
        return redlease.ReadWriteLock(self.client, name, ttl, **options)

    def fenced(self, resource: str, **options: Any) -> Any:
        return redlease.FencedRedis(self.client, resource, **options)

    def once(self, name: str, **options: Any) -> Any:
        return redlease.Once(self.client, name, **options)

    def close(self) -> None:
        self.client.close()


class AsyncTwin:
    kind = "async"

    def __init__(self, port: int, family: ClientFamily = FAMILIES["redis-py"]) -> None:
        self.portal = Portal()

        async def make() -> aredis.Redis:
            made: aredis.Redis = family.aclient(port=port)
            return made

        self.client = self.portal.call(make)

    def lock(self, name: str, ttl: float = 10.0, **options: Any) -> Any:
        return AsyncLockView(self.portal, redlease.AsyncLock(self.client, name, ttl, **options))

    def semaphore(self, name: str, limit: int, ttl: float = 10.0, **options: Any) -> Any:
        made = redlease.AsyncSemaphore(self.client, name, limit, ttl, **options)
        return AsyncLockView(self.portal, made)

    def rwlock(self, name: str, ttl: float = 10.0, **options: Any) -> Any:
        """Its sides as lock views; each call through the portal is a task of its own."""
        made = redlease.AsyncReadWriteLock(self.client, name, ttl, **options)
        return SimpleNamespace(
            read=AsyncLockView(self.portal, made.read),
            write=AsyncLockView(self.portal, made.write),
            name=made.name,
        )

    def fenced(self, resource: str, **options: Any) -> Any:
        """An AsyncFencedRedis whose apply and recorded run through the portal."""
        made = redlease.AsyncFencedRedis(self.client, resource, **options)
        return SimpleNamespace(
            apply=lambda fence, commands: self.portal.call(made.apply, fence, commands),
            recorded=lambda: self.portal.call(made.recorded),
            key=made.key,
            resource=made.resource,
        )

    def once(self, name: str, **options: Any) -> Any:
        return AsyncOnceView(self.portal, redlease.AsyncOnce(self.client, name, **options))

    def close(self) -> None:
        self.portal.call(self.client.aclose)
        self.portal.close()
