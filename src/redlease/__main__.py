"""``python -m redlease`` and the ``redlease`` command."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ._cli.command import main as _main

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``redlease`` command with ``argv`` (default: the process arguments)."""
    return _main(argv)


if __name__ == "__main__":
    sys.exit(main())
