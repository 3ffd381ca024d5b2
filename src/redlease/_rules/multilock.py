"""The rules of ``MultiLock`` and ``AsyncMultiLock`` (``_async.multilock`` and its
generated twin) that need no I/O: several lock names at once, all or none.

Each name is an ordinary lock (``Lock``'s keys, so a ``MultiLock`` over "a" and "b"
excludes a ``Lock`` on "a"). Taking them:

* where all of them live on the one server the client talks to (a standalone or
  Sentinel-managed client: not a Cluster, whose names hash to different slots), one
  script tries them all at once (``MULTI_ACQUIRE``): all free and nobody queued, all
  taken, with one token and a fence each; otherwise none is taken;
* otherwise, and whenever that try fails and the caller waits, the names are taken one
  after the other in one global order (their keys, sorted), each with the lock's own
  fair waiting: two multi-locks sharing names, in whatever order they were given, wait
  for each other in the same order, so they can never deadlock. A failure or a timeout
  part-way gives back what was taken; so does a name whose lease ran out while a later
  one was waited for (the wait starts over: a multi-lease is only ever all valid).

The result is a ``MultiLease``: a lease per name (each renewed, extended and released
as a lock's), with ``fences`` by name.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .._base.errors import InvalidArgument
from . import arguments as args
from .flows import Flow, LockSpec, as_int
from .scripts import MULTI_ACQUIRE

# More names than one all-or-nothing hold is of use with (each is a lock, and a try
# sends all their keys to one script).
MAX_NAMES = 1000


def checked_names(value: object) -> list[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidArgument(f"names must be a list of lock names, not {type(value).__name__}")
    names = [args.lock_name(n) for n in value]
    if not names:
        raise InvalidArgument("names must not be empty")
    if len(names) > MAX_NAMES:
        raise InvalidArgument(f"names must be at most {MAX_NAMES}, got {len(names)}")
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise InvalidArgument(f"names must be distinct: {twice!r} given more than once")
    return names


def try_all(specs: list[LockSpec], token: str) -> Flow[list[int] | None]:
    """All the locks in one script, or none: their fences, or None."""
    spec = specs[0]
    keys = tuple(k for s in specs for k in (s.keys.lock, s.keys.fence, s.keys.queue))
    reply = yield spec.call(MULTI_ACQUIRE, token, str(spec.ttl_ms), keys=keys)
    fences = [as_int(f) for f in reply]
    return fences or None


class MultiLeaseState:
    """A multi-lease's rules, held by the multi-lease a caller holds (``MultiLease``,
    ``AsyncMultiLease``): a lease per name, in the names' order."""

    # The multi-lease that holds this state (what a `with` block that noted it releases).
    lease: Any = None

    def __init__(self, names: list[str], leases: dict[str, Any]) -> None:
        # (Lease or AsyncLease: typed Any so that each twin calls its own methods)
        self._names = names
        self._leases = leases

    @property
    def leases(self) -> dict[str, Any]:
        """The lease of each name, in the order the names were given."""
        return {n: self._leases[n] for n in self._names}

    @property
    def fences(self) -> dict[str, int]:
        """Each name's fencing token."""
        return {n: self._leases[n].fence for n in self._names}

    @property
    def lost(self) -> bool:
        """True once any of the leases is lost."""
        return any(lease.lost for lease in self._leases.values())

    @property
    def released(self) -> bool:
        return all(lease.released for lease in self._leases.values())

    def remaining(self) -> float:
        """Seconds of validity left: the least of the leases'."""
        return min(float(lease.remaining()) for lease in self._leases.values())

    def check(self) -> None:
        """Raise LockLost unless every lease is still held and valid."""
        for lease in self._leases.values():
            lease.check()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.leases.values())

    def described(self, kind: str) -> str:
        """What the multi-lease of ``kind`` (its class's name) shows of itself."""
        return f"<{kind} {self._names!r} remaining={self.remaining():.3f}s>"

    def __repr__(self) -> str:
        return self.described(type(self).__name__)
