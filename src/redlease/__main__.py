"""``python -m redlease`` and the ``redlease`` command.

Light on purpose: ``import redlease`` loads nothing until a public name is used, so the
command handles SIGINT and SIGTERM from the first line of ``main``, before the library
and its clients are imported (about a quarter of a second): one line and the shell's
code for the signal, 130 or 143, never a traceback nor a silent death; a signal that
comes in the middle of an import is taken once the import is done, or as the command
ends (``_cli.signals``). A second signal while the first stops the command ends the
process at once with the first one's code; once the command has chosen its code, it
ends with that code whatever comes. A subcommand that must do more with a signal (``run``
passes it on to its command) sets its own handling and gives this back afterwards.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

from ._cli.signals import as_program, chosen, handled

__all__ = ["main"]


class _Terminated(BaseException):
    """SIGTERM, until a subcommand handles it its own way: unwinds as Ctrl-C does."""


def _unwind(signum: int) -> None:
    raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``redlease`` command with ``argv`` (default: the process arguments, and
    this process is the command: see ``_cli.signals.as_program``)."""
    if argv is None:
        as_program()
    try:
        with handled((signal.SIGINT, signal.SIGTERM), _unwind):
            from ._cli.command import main as command

            code = command(argv)
    except KeyboardInterrupt:
        print("redlease: interrupted", file=sys.stderr)
        code = 128 + signal.SIGINT
    except _Terminated:
        print("redlease: terminated", file=sys.stderr)
        code = 128 + signal.SIGTERM
    chosen(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
