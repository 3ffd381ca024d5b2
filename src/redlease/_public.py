"""Every public name of redlease, imported at once: the package loads this module on
first use of any of them (see ``redlease.__getattr__``)."""

# ruff: noqa: F401  (each import is what this module is for)

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
