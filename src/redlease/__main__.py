"""``python -m redlease`` and the ``redlease`` command.

Light on purpose: ``import redlease`` loads nothing until a public name is used, so the
command handles SIGINT and SIGTERM from the first line of ``main``, before the library
and its clients are imported (about a quarter of a second): one line and the shell's
code for the signal, 130 or 143, never a traceback nor a silent death; a signal that
comes in the middle of an import is taken once the import is done, or as the command
ends (``_cli.signals``). A subcommand that must do more with a signal (``run`` passes it on to
its command) sets its own handling and gives this back afterwards.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

from ._cli.signals import handled

__all__ = ["main"]


class _Terminated(BaseException):
    """SIGTERM, until a subcommand handles it its own way: unwinds as Ctrl-C does."""


def _unwind(signum: int) -> None:
    raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``redlease`` command with ``argv`` (default: the process arguments)."""
    try:
        with handled((signal.SIGINT, signal.SIGTERM), _unwind):
            from ._cli.command import main as command

            return command(argv)
    except KeyboardInterrupt:
        print("redlease: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except _Terminated:
        print("redlease: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main())
