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


def start(thread: threading.Thread) -> None:
    """``thread.start()``, the new thread blocking the process's signals from its first
    instruction on (it inherits the mask of the thread that starts it: blocked for the
    moment it takes to start, and put back; a signal meanwhile waits that long)."""
    if not _BLOCKED:
        thread.start()
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def daemon(target: Callable[..., Any], *args: Any, name: str) -> threading.Thread:
    """``target(*args)`` in a daemon thread of redlease's, started (see ``start``). A
    daemon: a lease left held must never keep the interpreter from exiting."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    start(thread)
    return thread
