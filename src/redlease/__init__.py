"""redlease: distributed locks on Redis and Valkey that are right, fast and honest.

import redis, redlease

lock = redlease.Lock(redis.Redis(), "orders:42", ttl=10.0)
with lock as lease:
    do_work(fence=lease.fence)
"""

import logging

from . import metrics as metrics  # (a module: redlease.metrics.configure)
from ._election import Leader
from ._election_async import AsyncElection, AsyncObservation
from ._election_sync import Election, Observation
from ._errors import (
    AcquireTimeout,
    BackendError,
    InvalidArgument,
    LockError,
    LockLost,
    QuorumError,
    RedleaseWarning,
)
from ._inspect import Holder, LockInfo, Waiter, aread_info, read_info
from ._lease_async import AsyncLease
from ._lease_sync import Lease
from ._lock_async import AsyncLock
from ._lock_sync import Lock
from ._multilock_async import AsyncMultiLease, AsyncMultiLock
from ._multilock_sync import MultiLease, MultiLock
from ._redlock_async import AsyncRedlock, AsyncRedlockLease
from ._redlock_sync import Redlock, RedlockLease
from ._rwlock_async import AsyncReadWriteLock
from ._rwlock_sync import ReadWriteLock
from ._semaphore_async import AsyncSemaphore
from ._semaphore_sync import Semaphore
from ._version import __version__

# A library's loggers print nothing of their own accord: the application configures
# logging (the "redlease" tree) if it wants to see them.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "AcquireTimeout",
    "AsyncElection",
    "AsyncLease",
    "AsyncLock",
    "AsyncMultiLease",
    "AsyncMultiLock",
    "AsyncObservation",
    "AsyncReadWriteLock",
    "AsyncRedlock",
    "AsyncRedlockLease",
    "AsyncSemaphore",
    "BackendError",
    "Election",
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
    "QuorumError",
    "ReadWriteLock",
    "RedleaseWarning",
    "Redlock",
    "RedlockLease",
    "Semaphore",
    "Waiter",
    "__version__",
    "aread_info",
    "read_info",
]

# Tracebacks, reprs and logs name each public class and function as it is imported
# (redlease.LockLost), not by the private module that defines it.
for _name in __all__:
    _public = globals()[_name]
    if callable(_public):
        _public.__module__ = __name__
del _name, _public
