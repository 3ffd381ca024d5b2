"""redlease: distributed locks on Redis and Valkey that are right, fast and honest.

import redis, redlease

lock = redlease.Lock(redis.Redis(), "orders:42", ttl=10.0)
with lock as lease:
    do_work(fence=lease.fence)
"""

import logging

from . import metrics as metrics  # (a module: redlease.metrics.configure)
from ._async.election import AsyncElection, AsyncObservation
from ._async.fenced import AsyncFencedRedis
from ._async.inspect import aread_info
from ._async.lease import AsyncLease
from ._async.lock import AsyncLock
from ._async.multilock import AsyncMultiLease, AsyncMultiLock
from ._async.once import AsyncOnce, AsyncRun
from ._async.redlock import AsyncRedlock, AsyncRedlockLease
from ._async.rwlock import AsyncReadWriteLock
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
from ._base.version import __version__
from ._rules.election import Leader
from ._rules.inspect import Holder, LockInfo, Waiter
from ._rules.once import Skipped
from ._sync.election import Election, Observation
from ._sync.fenced import FencedRedis
from ._sync.inspect import read_info
from ._sync.lease import Lease
from ._sync.lock import Lock
from ._sync.multilock import MultiLease, MultiLock
from ._sync.once import Once, Run
from ._sync.redlock import Redlock, RedlockLease
from ._sync.rwlock import ReadWriteLock
from ._sync.semaphore import Semaphore
from .jobs import once

# A library's loggers print nothing of their own accord: the application configures
# logging (the "redlease" tree) if it wants to see them.
logging.getLogger(__name__).addHandler(logging.NullHandler())

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
    "AsyncRedlock",
    "AsyncRedlockLease",
    "AsyncRun",
    "AsyncSemaphore",
    "BackendError",
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
    "Once",
    "QuorumError",
    "ReadWriteLock",
    "RedleaseWarning",
    "Redlock",
    "RedlockLease",
    "Run",
    "Semaphore",
    "Skipped",
    "StaleFence",
    "Waiter",
    "__version__",
    "aread_info",
    "once",
    "read_info",
]

# Tracebacks, reprs and logs name each public class and function as it is imported
# (redlease.LockLost), not by the private module that defines it.
for _name in __all__:
    _public = globals()[_name]
    if callable(_public):
        _public.__module__ = __name__
del _name, _public
