"""Helpers for testing code that uses redlease.

``FakeClock`` stands in for the monotonic clock (``Lock(..., clock=fake)``) so that
lease validity and deadlines can be tested without sleeping.
"""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go back")
        self.now += seconds
