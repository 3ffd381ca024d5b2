"""Handlers that raise on a signal, raising only where an exception is taken well.

A Python handler runs between any two instructions of the main thread, and two places
take an exception raised there badly: the import system, whose module-lock callback
prints it as "Exception ignored" and drops it (the command then runs on, and waits out
its timeouts), and code compiled from a string, as the methods a dataclass makes at
import, from which an escaping KeyboardInterrupt marks the interpreter to end by SIGINT
at exit whatever code the command returns. The command imports the library on first
use, so a Ctrl-C in its first half second lands in one or the other: there the handler
sends the signal again a moment later instead, to be handled once the import is done, and
a signal still put off when the handling ends (the command was done by then) is taken as
it ends.

Light on purpose, as ``redlease.__main__`` is: it imports nothing of the library.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing: start-up)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["as_program", "chosen", "handled"]

# Frames of the import system and of code compiled from a string, by their file names.
_UNSAFE = ("<frozen importlib.", "<string>")
# A deferred signal is sent again every this long until a handler takes it (one sent just
# before the main thread blocks on a socket wakes nothing: the wait runs out first).
_AGAIN_EVERY = 0.01
# Deferred this many times, a signal is handled where it lands (an import that never
# ends would otherwise never take it).
_DEFER_AT_MOST = 200
# After a deferred signal is taken, the same signal is dropped for this long: it is the
# copy that was on its way (two real ones so close are one key pressed twice).
_QUIET = 0.1


class _Program:
    """Whether this process is the command itself (``main`` run as the program, not
    called in-process), and the exit code it is due once a signal has stopped it or it
    has chosen its code."""

    on = False
    due: int | None = None


_PROGRAM = _Program()


def as_program() -> None:
    """This process is the command: from now to its end, a SIGINT or SIGTERM outside a
    ``handled`` block, or one that comes after a signal stopped the command, ends the
    process at once, its output flushed, with the code it is due (a second Ctrl-C, or a
    signal during the interpreter's shutdown, killed it silently, or printed an error
    Python ignored). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    _PROGRAM.on, _PROGRAM.due = True, None
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _end_now)


def chosen(code: int) -> None:
    """The command chose its exit code: the process ends with it, whatever signal comes
    now. As the program, it ignores SIGINT and SIGTERM from here: the interpreter's
    shutdown (a tenth of a second once a client was used) puts a Python handler back to
    the default, death by the signal, and leaves an ignored one ignored."""
    _PROGRAM.due = code
    if _PROGRAM.on:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


def _end_now(signum: int, frame: FrameType | None) -> None:
    code = _PROGRAM.due
    if code is None:  # (between two handled blocks, before any other signal)
        code = 128 + signum
        name = "interrupted" if signum == signal.SIGINT else "terminated"
        os.write(2, f"redlease: {name}\n".encode())
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 (contextlib is not loaded this early)
            stream.flush()
        except Exception:  # (a write it interrupted may refuse: end all the same)
            pass
    os._exit(code)


def _unsafe_frames(frame: FrameType | None) -> int:
    count = 0
    while frame is not None:
        count += frame.f_code.co_filename.startswith(_UNSAFE)
        frame = frame.f_back
    return count


def _frame_above(levels: int) -> FrameType | None:
    """The frame ``levels`` calls above this function's caller (read off a traceback:
    public ground)."""
    try:
        raise RuntimeError
    except RuntimeError as here:
        traceback = here.__traceback__
    frame = traceback.tb_frame if traceback is not None else None  # (this function's)
    for _ in range(levels + 1):
        frame = frame.f_back if frame is not None else None
    return frame


class _Deferring:
    """The handler ``handled`` installs; main-thread state, as every handler runs there
    (the sender thread only reads ``owed``)."""

    def __init__(self, handler: Callable[[int], None], under: int) -> None:
        self.handler = handler
        self.under = under
        self.owed: set[int] = set()
        self.quiet_until: dict[int, float] = {}
        self.deferred = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if signum not in self.owed and now < self.quiet_until.get(signum, 0.0):
            return
        if _PROGRAM.on and _PROGRAM.due is not None:  # (the command is already ending)
            _end_now(signum, frame)
        if self.deferred < _DEFER_AT_MOST and _unsafe_frames(frame) > self.under:
            self.deferred += 1
            if signum not in self.owed:
                self.owed.add(signum)
                threading.Thread(target=self._send_again, args=(signum,), daemon=True).start()
            return
        self.deferred = 0
        if signum in self.owed:
            self.owed.discard(signum)
            self.quiet_until[signum] = now + _QUIET
        self._take(signum)

    def _take(self, signum: int) -> None:
        try:
            self.handler(signum)
        except BaseException:
            if _PROGRAM.due is None:  # it stops the command: the code the shell expects
                _PROGRAM.due = 128 + signum
            raise

    def settle(self) -> None:
        """Take a signal still put off (its block ends at a safe point)."""
        if self.owed:
            signum = min(self.owed)
            self.owed.clear()
            self._take(signum)

    def _send_again(self, signum: int) -> None:
        # To the main thread: sent to the process, it may land in this thread, and a main
        # thread blocked on a socket would not wake for it. This thread takes none (as
        # the library's threads, _base.threads: this module imports none of it).
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
        main = threading.main_thread().ident
        assert main is not None
        while signum in self.owed:
            time.sleep(_AGAIN_EVERY)
            if signum not in self.owed:
                return
            if signal.getsignal(signum) is not self:
                # Handled otherwise now (a subcommand's handling, or the block's end):
                # the new handler gets it, once.
                self.owed.discard(signum)
                signal.pthread_kill(main, signum)
                return
            signal.pthread_kill(main, signum)


class handled:
    """``with handled(signums, handler):`` routes each of ``signums`` to
    ``handler(signum)`` while the block runs, where an exception it raises unwinds the
    command as it should; a signal that comes at an unsafe point is sent again until it
    is taken, and one still put off when the block ends is taken there. Main thread only:
    elsewhere (an embedding application's worker thread) signals are left alone."""

    def __init__(self, signums: tuple[int, ...], handler: Callable[[int], None]) -> None:
        self._signums, self._handler = signums, handler
        self._deferring: _Deferring | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        # Unsafe frames already under the block do not count: a command started from code
        # that is itself a string (``python -c``) is at a safe point in its own code.
        deferring = _Deferring(self._handler, _unsafe_frames(_frame_above(1)))
        self._deferring = deferring
        self._previous = {s: signal.signal(s, deferring) for s in self._signums}

    def __exit__(self, *exc: object) -> None:
        for signum, old in self._previous.items():
            if old is not None:  # (None: a handler not set from Python)
                signal.signal(signum, old)
        if self._deferring is not None:
            self._deferring.settle()
