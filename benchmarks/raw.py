"""The raw references: the plainest hand-written cycles a lock is measured against,
over redis-py connections, written once for the benchmark and the instructions tool.
(It imports nothing of this package's: ``benchmarks.instructions --against`` copies it
into an older revision's tree beside itself.)"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

# The careful hand-written release: delete only if the token is still ours.
RELEASE_SCRIPT = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
    "else return 0 end"
)


def redlock_cycle(conns: Sequence[Any], sha: str, key: str, px: str) -> None:
    """One Redlock cycle at its plainest: ``SET NX PX`` written to every master's
    connection, then the replies read; the release (RELEASE_SCRIPT, loaded as ``sha``)
    likewise. No fencing, no timeouts, no validity check."""
    token = os.urandom(16).hex()
    for conn in conns:
        conn.send_command("SET", key, token, "NX", "PX", px)
    if sum(conn.read_response() is not None for conn in conns) < len(conns):
        raise RuntimeError("direct Redlock: key was taken")
    for conn in conns:
        conn.send_command("EVALSHA", sha, "1", key, token)
    for conn in conns:
        conn.read_response()
