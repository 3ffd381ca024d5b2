"""What the one-server locks share that needs no I/O (``_async.lock`` and its generated twin
hold ``Lock``, ``AsyncLock`` and their ``OneServer`` bases): asking the
server who holds a name, the table of leases each holder took, and the client a
``replicas=`` lock needs.
"""

from __future__ import annotations

from .._base.errors import InvalidArgument
from . import inspect as _inspect
from .flows import Flow, LockSpec
from .inspect import LockInfo
from .lease import Acquired


def check_replicas(spec: LockSpec, direct: bool) -> None:
    if spec.replicas is not None and not direct:
        raise InvalidArgument(
            "replicas needs a standalone client (redis.Redis, valkey.Valkey; or Sentinel's): "
            "WAIT must run on the connection that made the write"
        )


class Named:
    """What an object over one lock spec says of itself: its name and ttl."""

    _spec: LockSpec

    @property
    def name(self) -> str:
        """The name, as given."""
        return self._spec.name

    @property
    def ttl(self) -> float:
        """The lease length, in seconds."""
        return self._spec.ttl


def spec_of(named: Named) -> LockSpec:
    """The spec of a lock, a side of a read/write lock, a semaphore or an election."""
    return named._spec


class OneName(Named):
    """A lock over one name's keys on one deployment: what it needs to answer
    ``locked()``, ``owned()`` and ``waiting()`` (the INSPECT flow, see ``_rules.inspect``, and
    the leases each holder took)."""

    _acquired: Acquired | None = None

    def _look(self) -> Flow[LockInfo]:
        spec = self._spec
        kind = _inspect.kind_of(spec.kind)
        return _inspect.inspect(spec.keys, spec.name, kind, spec.reply_timeout)

    def _acquirers(self) -> Acquired:
        acquired = self._acquired
        if acquired is None:  # (setdefault: two threads' first acquires keep one table)
            acquired = self.__dict__.setdefault("_acquired", Acquired())
        return acquired
