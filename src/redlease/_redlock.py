"""Redlock over several independent masters (not available yet)."""

from __future__ import annotations

from typing import Any


class Redlock:
    """A lock held on a majority of independent masters. Not implemented yet."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("Redlock is not implemented yet")


class AsyncRedlock:
    """asyncio twin of ``Redlock``. Not implemented yet."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("AsyncRedlock is not implemented yet")
