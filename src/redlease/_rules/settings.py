"""The one look at a server's settings before a lock's first acquire, and its warning.

A server that may evict lock keys frees locks silently (only ``noeviction`` is safe); a
Redlock node that keeps nothing on disk forgets its fence counters when it restarts. A
lock's driver looks once (``_async.io``: the eviction policy; ``_async.redlock``: each
node's policy and persistence), and each server is looked at once per process. The look
only warns: it never fails an acquire, and gives up within its bound.
"""

from __future__ import annotations

import weakref
from typing import Any

from .._base.errors import warn
from .ops import Command

# How long the look at one server may take (it is made within the first acquire's own
# bound: a server that cannot answer by then is not looked at, and nothing is learnt).
SETTINGS_WAIT = 0.25
# A Redlock's look waits at least this long per node (a slow node is not skipped).
NODE_WAIT = 0.05
MIN_LOOK = 0.01  # less time than this left: the look waits for a later acquire

POLICY = "maxmemory-policy"

# The servers looked at in this process: redlease's pool for each, or else its client.
_LOOKED: weakref.WeakSet[Any] = weakref.WeakSet()


class Look:
    """One driver's look at its server(s): made once (``done``), by its first acquire
    with time enough left for it."""

    __slots__ = ("done", "longest")

    def __init__(self, longest: float) -> None:
        self.done = False
        self.longest = longest  # the most it may take

    def due(self, within: float | None) -> float | None:
        """How long the look may take now: ``longest``, or ``within`` (the time the
        acquire has left) if shorter; it is then done. None if it was made already, or if
        that is too short to look now (a later acquire looks)."""
        if self.done:
            return None
        wait = self.longest if within is None else min(self.longest, within)
        if wait < MIN_LOOK:
            return None
        self.done = True
        return wait


def first_look(pool: object, client: object) -> bool:
    """Whether the server behind ``pool`` (redlease's, None if the client's calls go
    through the client) or else ``client`` is yet to be looked at; from now on it is not."""
    server = pool if pool is not None else client
    if server in _LOOKED:
        return False
    _LOOKED.add(server)
    return True


def eviction_policy(wait: float) -> Command:
    """A one-server lock's look: the eviction policy alone."""
    return Command(("CONFIG", "GET", POLICY), wait, patient=False)


def node_settings(wait: float) -> Command:
    """A Redlock node's look: its eviction policy and its persistence. One pattern, as
    Redis 6.2's CONFIG GET takes one: it matches maxmemory-policy, appendonly and save,
    and a few other settings (max..., append...) that go unread."""
    return Command(("CONFIG", "GET", "[mas][apa][xpv]*"), wait)


def _as_dict(reply: Any) -> dict[str, str]:
    """CONFIG GET's reply (a map in RESP3, a flat list of pairs in RESP2) as a dict."""
    if isinstance(reply, dict):
        pairs = list(reply.items())
    else:
        items = list(reply or [])
        pairs = list(zip(items[::2], items[1::2], strict=False))
    return {_text(k): _text(v) for k, v in pairs}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def weakness(reply: Any) -> str | None:
    """What in the settings of ``reply`` (CONFIG GET's) weakens the locks, in words:
    evicting keys to make room; and, if the reply tells (``node_settings`` asks),
    keeping nothing on disk (neither an append-only file nor snapshots), so that a
    restart forgets every fence counter. None if nothing does."""
    settings = _as_dict(reply)
    found = []
    policy = settings.get(POLICY, "noeviction")
    if policy != "noeviction":
        found.append(
            f"the server's maxmemory-policy is {policy!r}: under memory pressure it may "
            "evict lock keys, which silently frees locks; set it to 'noeviction'"
        )
    if settings.get("appendonly") == "no" and settings.get("save", "x").strip() == "":
        # RDB snapshots count: they keep fence counters no older than the last one, and
        # the clock rule covers the gap (docs/redlock.md); so does an AOF fsynced each
        # second. Only "appendfsync always" depends on no clock: that is the docs' advice.
        found.append(
            "the server keeps nothing on disk (appendonly no, no save points): a restart "
            "forgets its fence counters, and the fences of a Redlock then rely on the "
            "clock rule alone; set appendonly yes (appendfsync always to depend on no clock)"
        )
    return "; ".join(found) or None


def warn_if_weak(server: str, reply: Any) -> None:
    """Warn (once per process for each server and finding) of what ``reply`` says
    weakens the locks on ``server``; nothing for a failed look (an error: CONFIG may be
    renamed, denied by ACL, not routable, or the server down: nothing is learnt)."""
    if isinstance(reply, BaseException):
        return
    found = weakness(reply)
    if found:
        said = f"{server}: {found}"
        warn(said, once=said)
