"""redlease: distributed locks on Redis and Valkey that are right, fast and honest.

import redis, redlease

lock = redlease.Lock(redis.Redis(), "orders:42", ttl=10.0)
with lock as lease:
    do_work(fence=lease.fence)
"""

import types

# typing.TYPE_CHECKING without importing typing (a tenth of the command's start-up)
TYPE_CHECKING = False

if TYPE_CHECKING:  # (the names as the type checkers see them; loaded on first use)
    from . import metrics as metrics  # (a module: redlease.metrics.configure)
    from ._async.election import AsyncElection, AsyncObservation
    from ._async.fenced import AsyncFencedRedis
    from ._async.front import AsyncLease
    from ._async.inspect import aread_info
    from ._async.lock import AsyncLock
    from ._async.multilock import AsyncMultiLease, AsyncMultiLock
    from ._async.once import AsyncOnce, AsyncRun
    from ._async.redlock import AsyncRedlock, AsyncRedlockLease
    from ._async.rwlock import AsyncReadWriteLock, AsyncReadWriteSide
    from ._async.semaphore import AsyncSemaphore
    from ._base.errors import (
        AcquireTimeout,
        BackendError,
        InvalidArgument,
        LockError,
        LockLost,
        QuorumError,
        RedleaseWarning,
        StaleFence,
    )
    from ._base.types import Clock, OnLost, Seconds
    from ._base.version import __version__
    from ._once import once
    from ._rules.election import Leader
    from ._rules.inspect import Holder, LockInfo, Waiter
    from ._rules.once import Skipped
    from ._sync.election import Election, Observation
    from ._sync.fenced import FencedRedis
    from ._sync.front import Lease
    from ._sync.inspect import read_info
    from ._sync.lock import Lock
    from ._sync.multilock import MultiLease, MultiLock
    from ._sync.once import Once, Run
    from ._sync.redlock import Redlock, RedlockLease
    from ._sync.rwlock import ReadWriteLock, ReadWriteSide
    from ._sync.semaphore import Semaphore


__all__ = [
    "AcquireTimeout",
    "AsyncElection",
    "AsyncFencedRedis",
    "AsyncLease",
    "AsyncLock",
    "AsyncMultiLease",
    "AsyncMultiLock",
    "AsyncObservation",
    "AsyncOnce",
    "AsyncReadWriteLock",
    "AsyncReadWriteSide",
    "AsyncRedlock",
    "AsyncRedlockLease",
    "AsyncRun",
    "AsyncSemaphore",
    "BackendError",
    "Clock",
    "Election",
    "FencedRedis",
    "Holder",
    "InvalidArgument",
    "Leader",
    "Lease",
    "Lock",
    "LockError",
    "LockInfo",
    "LockLost",
    "MultiLease",
    "MultiLock",
    "Observation",
    "OnLost",
    "Once",
    "QuorumError",
    "ReadWriteLock",
    "ReadWriteSide",
    "RedleaseWarning",
    "Redlock",
    "RedlockLease",
    "Run",
    "Seconds",
    "Semaphore",
    "Skipped",
    "StaleFence",
    "Waiter",
    "__version__",
    "aread_info",
    "once",
    "read_info",
]

# Submodules reachable as attributes without an import of their own.
_SUBMODULES = frozenset({"metrics", "sql", "testing", "tools"})


if not TYPE_CHECKING:  # (type checkers see the names above, and no others)

    def __getattr__(name: str) -> object:
        """The public names are loaded on first use, all at once: ``import redlease``
        costs next to nothing (the command line handles signals from its first
        instruction), and a program pays for the library when it first touches it.
        ``redlease.sql`` is loaded by itself, without a database driver, as is any
        submodule asked for by name."""
        import importlib

        if name in __all__:
            _load()
            return globals()[name]
        private = name.startswith("_") and not name.startswith("__") and "." not in name
        if name in _SUBMODULES or private:
            module = f"{__name__}.{name}"
            try:
                return importlib.import_module(module)
            except ModuleNotFoundError as missing:
                if missing.name != module:  # (a module it imports is missing: say so)
                    raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__, *_SUBMODULES})


del TYPE_CHECKING  # (not a name of the package's)


def _load() -> None:
    import importlib

    _public = importlib.import_module(f"{__name__}._public")

    for public in __all__:
        value = getattr(_public, public)
        # Tracebacks, reprs and logs name each public class and function as it is
        # imported (redlease.LockLost), not by the private module that defines it (the
        # type aliases, Seconds..., are left as they are: on Python 3.10 a generic alias
        # also passes for a type).
        if isinstance(value, (type, types.FunctionType)) and not isinstance(
            value, types.GenericAlias
        ):
            value.__module__ = __name__
        globals()[public] = value
