"""Time: the clock seam, deadlines, validity arithmetic and the retry schedule.

Only a monotonic clock is used: wall-clock steps (NTP, a user changing the date) cannot
stretch or shrink a lease. The clock is injectable (``clock=``) so the rules can be
tested with a fake one (``redlease.testing.FakeClock``).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from .types import Clock

MONOTONIC: Clock = time.monotonic

# The shortest wait a driver is asked for: never 0 s, which a blocking pop (BLPOP) takes
# as "forever" and a read as "do not wait" (a reply already there is still taken), and
# BLPOP's own resolution (milliseconds).
SHORTEST_WAIT = 0.001

# Redlock's allowance for server clocks running at slightly different rates, applied to
# every lease: validity = ttl - elapsed - drift (antirez, "Distributed locks with Redis").
DRIFT_FACTOR = 0.01
DRIFT_FLOOR = 0.002

# How long a waiter's queue entry outlives its planned wake-up: room for a late wake-up
# before the queue treats the waiter as gone.
QUEUE_ENTRY_SLACK = 1.0

# A waiter whose holder's lock has no readable TTL re-checks at least this often.
UNKNOWN_HOLDER_RECHECK = 1.0

# An unfair lock (fair=False) lets a caller barge in on its released lock, and wakes its
# first waiter to compete: one waiter at a time, marked woken for UNFAIR_WOKEN seconds,
# during which releases wake nobody else and the woken waiter, if it lost the race, tries
# again once UNFAIR_WOKEN later (so a lock its barging holder left free is found). A
# waiter that has been queued UNFAIR_STARVING seconds is handed the lock by the next
# release instead, as a fair lock would (after Go's sync.Mutex "starvation mode"): no
# waiter of an unfair lock waits much longer than that behind a stream of bargers.
UNFAIR_WOKEN = 0.005
UNFAIR_STARVING = 0.1

# A wait with time left (an acquire, an observer) tries again after a failure that may
# pass, after a back-off from this base up to this cap.
PASSING_RETRY_BASE = 0.05
PASSING_RETRY_CAP = 1.0
# A failed connection is tried again at once, then its other retries spread over the
# operation's bound, at most the cap apart (a restart of a second or two is waited out by
# a few retries), at least a back-off from the base up to the cap (for a count without end).
CONNECT_RETRY_BASE = 0.01
CONNECT_RETRY_CAP = 1.0


def backoff(failures: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """The delay before trying again after the ``failures``-th failure in a row: random,
    from a range that doubles with each failure from ``base`` up to ``cap``, and never
    below half of it ("equal jitter"), so that clients that failed together do not try
    again in step. The one back-off of every retry: an acquire's, an observer's, and a
    Redlock's after a failed round."""
    ceiling = min(cap, base * 2 ** min(failures, 30))
    return (rng or random).uniform(ceiling / 2, ceiling)


def drift(ttl: float) -> float:
    return ttl * DRIFT_FACTOR + DRIFT_FLOOR


def longest_validity(ttl: float) -> float:
    """How long a lease of ``ttl`` seconds is valid if granted in no time: ``ttl - drift``.
    Zero or less: no lease of that ttl can ever be used."""
    return ttl - drift(ttl)


def valid_until(sent_at: float, remaining_ms: int, ttl: float) -> float:
    """When a lease stops being safe to use, on the local monotonic clock.

    ``sent_at`` is read before the command was sent, so all time the command spent in
    flight (or the client spent paused) is counted against the lease; ``remaining_ms``
    is the key's PTTL as the server saw it.
    """
    return sent_at + remaining_ms / 1000.0 - drift(ttl)


@dataclass
class Deadline:
    """One deadline, computed once and handed down as time left."""

    clock: Clock
    at: float | None  # None: no deadline

    @classmethod
    def after(cls, clock: Clock, timeout: float | None) -> Deadline:
        return cls(clock, None if timeout is None else clock() + timeout)

    def left(self) -> float | None:
        if self.at is None:
            return None
        return max(0.0, self.at - self.clock())

    def expired(self) -> bool:
        return self.at is not None and self.clock() >= self.at

    def cap(self, seconds: float) -> float:
        left = self.left()
        return seconds if left is None else min(seconds, left)
