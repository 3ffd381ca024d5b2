# Generated from _async/fenced.py by scripts/unasync.py: edit that file, then run
# `python scripts/unasync.py` (the tests run it with --check).
"""``FencedRedis``: the fence gate for Redis data, on the lock's server or any other
(the rules and the script are in ``_rules.fenced``). Written once, as asyncio code;
``scripts/unasync.py`` generates the blocking twin (``FencedRedis``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._base.types import Seconds
from .._clients.checks import check_client
from .._rules import arguments as args
from .._rules import fenced as _fenced
from .._rules.keys import gate_key, hash_tag
from .backend import ASYNC
from .io import IO


class FencedRedis:
    """Writes to Redis data that a stale lease holder cannot make: each ``apply`` runs
    its commands only if its fence is not smaller than the greatest that has passed for
    ``resource``, in one script (one round trip; nothing runs in between).

    ``client``: the Redis (Valkey) the data lives on, the lock's server or any other,
    standalone, Sentinel-managed or Cluster. On a Cluster every key a command writes
    must be in the hash slot of ``resource``: give the keys the hash tag ``tag`` says
    (``{account:7}`` for ``"account:7"``); a key outside it is refused by name.
    ``keep``: how long the record of the greatest fence outlives the last fence that
    passed (a day by default: every smaller fence is refused while it lives; once it is
    gone, the next fence passes whatever it is). ``prefix``: where the record lives
    (``P{resource}:gate``), as the locks' keys.
    """

    def __init__(
        self,
        client: Any,
        resource: str,
        *,
        keep: Seconds = 86400.0,
        prefix: str = "redlease:",
    ) -> None:
        check_client(client, want_async=ASYNC, sync_twin="FencedRedis")
        self._resource = _fenced.resource(resource)
        self._keep = _fenced.keep_ms(keep)
        self._record = gate_key(self._resource, args.key_prefix(prefix))
        self._io = IO(client)

    @property
    def resource(self) -> str:
        """The name of what the fence guards, as given."""
        return self._resource

    @property
    def tag(self) -> str:
        """The hash tag to give the keys the commands write, so that on a Cluster they
        share the record's slot: ``{resource}``, its braces and "%" escaped as the locks'
        keys escape them (``{account:7}`` for ``"account:7"``)."""
        return hash_tag(self._resource)

    @property
    def key(self) -> str:
        """The key in which the greatest fence passed is recorded."""
        return self._record

    def apply(self, fence: int, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Run ``commands`` (each a tuple: its name, its one key, its other arguments,
        such as ``("SET", key, value)`` or ``("HSET", key, field, value)``) if ``fence``
        is not smaller than the greatest recorded for the resource, recording it; their
        replies, in order, as the server gives them.

        Raises ``StaleFence`` (a ``LockLost``) if a greater fence has passed: nothing
        ran. ``BackendError`` if a command failed (a wrong type, say): the ones before
        it stand, as in any Redis script, and the error says which failed. A reply lost
        on the way leaves the outcome unknown: the commands are never sent twice.
        ``InvalidArgument`` for a command the gate does not take (several keys, none,
        the server's state: split it into one command per key).
        """
        value = _fenced.fence(fence)
        keys, words = _fenced.commands(commands, self._record, self._io.cluster)
        flow = _fenced.apply(
            self._resource, self._record, value, self._keep, keys, words, _fenced.REPLY_WAIT
        )
        return self._io.run(flow, f"apply fenced commands for {self._resource!r}")

    def recorded(self) -> int | None:
        """The greatest fence that has passed for the resource (None: none recorded)."""
        flow = _fenced.recorded(self._record, _fenced.REPLY_WAIT)
        return self._io.run(flow, f"read the fence recorded for {self._resource!r}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._resource!r}>"
