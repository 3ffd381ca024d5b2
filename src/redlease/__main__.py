"""``python -m redlease`` and the ``redlease`` command.

Light on purpose: ``import redlease`` loads nothing until a public name is used, so the
command handles SIGINT and SIGTERM from the first line of ``main``, before the library
and its clients are imported (about a quarter of a second): one line and the shell's
code for the signal, 130 or 143, never a traceback nor a silent death. A subcommand that
must do more with a signal (``run`` passes it on to its command) sets its own handling
and gives this back afterwards.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

__all__ = ["main"]


class _Terminated(BaseException):
    """SIGTERM, until a subcommand handles it its own way: unwinds as Ctrl-C does."""


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``redlease`` command with ``argv`` (default: the process arguments)."""
    ours = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if ours else None
    try:
        from ._cli.command import main as command

        return command(argv)
    except KeyboardInterrupt:
        print("redlease: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except _Terminated:
        print("redlease: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if ours and previous is not None:  # (None: a handler not set from Python)
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
