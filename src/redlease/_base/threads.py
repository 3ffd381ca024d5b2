"""The threads redlease starts: daemons that take no signal meant for the process.

A signal sent to a process goes to any one of its threads that does not block it, and
Python runs its handler in the main thread only, when that thread next runs Python code.
Taken by one of redlease's threads, a Ctrl-C or a SIGTERM would wait until the main
thread's blocking call ended by itself (a socket read, a wait for a lock, for a child
process: ``redlease run`` waited for its command's own end). So redlease's threads block
every signal but the faults a thread raises by itself, and a signal for the process is
the main thread's, which it interrupts at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

# Raised by the faulting thread itself; one blocked there would kill the process at once
# (and keep faulthandler from saying where).
_FAULTS = {"SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGTRAP", "SIGSYS"}
_BLOCKED: set[signal.Signals] = (
    {s for s in signal.valid_signals() if isinstance(s, signal.Signals) and s.name not in _FAULTS}
    if hasattr(signal, "pthread_sigmask")
    else set()  # (Windows: no per-thread masks, and handlers run in the main thread)
)


def made(target: Callable[..., Any], *args: Any, name: str) -> threading.Thread:
    """A thread of redlease's for ``target(*args)``, not started yet (see ``start``). A
    daemon: a lease left held must never keep the interpreter from exiting."""
    return threading.Thread(target=target, args=args, name=name, daemon=True)


def start(thread: threading.Thread) -> None:
    """``thread.start()``, the new thread blocking the process's signals from its first
    instruction on (it inherits the mask of the thread that starts it: blocked for the
    moment it takes to start, and put back; a signal meanwhile waits that long).

    An error a signal handler raises while start() waits for the thread (a Ctrl-C the
    application catches) can leave its Condition half-released: CPython then raises a
    RuntimeError ("release unlocked lock") of its own in its place, with the thread
    running (its ``ident`` set). The interruption is what goes on."""
    try:
        if not _BLOCKED:
            thread.start()
            return
        # Read first, blocked inside the try: a handler's error raised as a call returns
        # (CPython runs pending handlers there) must not leave this thread's mask changed.
        before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
            thread.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
    except RuntimeError as error:
        cause = error.__context__
        if cause is not None and not isinstance(cause, Exception):
            raise cause from None
        raise


def daemon(target: Callable[..., Any], *args: Any, name: str) -> threading.Thread:
    """``target(*args)`` in a thread of redlease's (``made``), started (``start``)."""
    thread = made(target, *args, name=name)
    start(thread)
    return thread
