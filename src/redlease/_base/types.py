"""The types public signatures name, defined once: ``redlease.Seconds``,
``redlease.OnLost`` and ``redlease.Clock``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeAlias

Seconds: TypeAlias = float | timedelta
"""A duration: seconds, as an ``int`` or a ``float``, or a ``datetime.timedelta``."""

OnLost: TypeAlias = Callable[[Any], object]
"""What is told of a lease found lost: called once, with the lease (what it returns is
ignored). Keep it short: it runs on the renewer's thread (asyncio: in its event loop)."""

Clock: TypeAlias = Callable[[], float]
"""A monotonic clock: seconds, as ``time.monotonic`` (the default) counts them. Tests
pass ``redlease.testing.FakeClock`` to move time by hand."""
