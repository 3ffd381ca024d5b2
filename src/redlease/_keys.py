"""Key layout. Every key of one lock carries the same Cluster hash tag, so each script
touches a single slot:

    {name}               the lock: value = holder's token, always with a TTL
    {name}:fence         fencing counter (raised by every grant; the one key kept without
                         TTL, because a counter that expires could hand out a smaller token)
    {name}:queue         waiters in arrival order (list of tokens), with a TTL
    {name}:waiters       waiter token -> "deadline_us:ttl_ms:holds" (hash), with a TTL
    {name}:bell:<token>  a waiter's doorbell list, pushed by the release script, with a TTL
    {name}:bell:@<hub>   not a key: the pub/sub channel on which the waiters of one
                         process's hub (its shared wait connection) are rung
    {name}:released      the token of the last release, for a retried release to find,
                         with a TTL (the release's reply bound)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


def hash_tag(name: str) -> str:
    # Redis hashes the text between the first "{" and the next "}". A name that starts
    # with "}" would make that tag empty (and the keys land in different slots), so such
    # names are tagged by a digest instead.
    if name.startswith("}"):
        return "{#" + hashlib.sha1(name.encode()).hexdigest()[:24] + "}"
    return "{" + name + "}"


@dataclass(frozen=True)
class LockKeys:
    lock: str
    fence: str
    queue: str
    waiters: str
    bell_prefix: str

    @classmethod
    def for_name(cls, name: str, prefix: str = "") -> LockKeys:
        base = prefix + hash_tag(name)
        return cls(
            lock=base,
            fence=base + ":fence",
            queue=base + ":queue",
            waiters=base + ":waiters",
            bell_prefix=base + ":bell:",
        )

    def bell(self, token: str) -> str:
        return self.bell_prefix + token

    @property
    def script_keys(self) -> tuple[str, str, str, str]:
        return (self.lock, self.fence, self.queue, self.waiters)
