"""What ``with`` on an asyncio object says. Python's own message ("does not support the
context manager protocol") does not say that ``async with`` is meant, or that a
blocking twin exists.

Only this direction is covered. Code that takes either kind of context manager usually
asks for ``__aenter__`` first (redlease's own tests do): a blocking object given an
``__aenter__`` that raises would be taken for an asyncio one there, while an asyncio
object's ``__enter__`` is not reached. ``async with`` on a blocking object keeps
Python's message. Type checkers see neither method, so they still flag the misuse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import InvalidArgument


class AsyncOnly:
    """Mixed into the asyncio classes that are used with ``async with``."""

    __slots__ = ()

    if not TYPE_CHECKING:

        def __enter__(self):
            name = type(self).__name__
            if name.startswith("_"):  # (a class of no public name)
                name, twin = "this object", "the blocking twin"
            else:
                twin = name.removeprefix("Async")
            raise InvalidArgument(
                f"{name} is for asyncio: use `async with`, not `with` "
                f"(blocking code uses {twin}, with `with`)"
            )

        def __exit__(self, *exc):  # (never reached: __enter__ raised)
            return None
