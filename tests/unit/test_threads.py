"""redlease's threads block the process's signals (``_base.threads``): a signal sent to
the process is the main thread's, and interrupts what it waits for at once."""

from __future__ import annotations

import signal
import sys
import threading

import pytest

from redlease._base import threads as _threads

pytestmark = pytest.mark.skipif(
    not hasattr(signal, "pthread_sigmask"), reason="no per-thread signal masks here"
)


def _mask_in(start: object) -> set[int]:
    seen: list[set[int]] = []

    def look() -> None:
        seen.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))

    if start is _threads.daemon:
        _threads.daemon(look, name="look").join(5)
    else:
        thread = threading.Thread(target=look)
        _threads.start(thread)
        thread.join(5)
    return seen[0]


@pytest.mark.parametrize("start", [_threads.daemon, _threads.start])
def test_a_thread_of_ours_blocks_the_signals_but_its_own_faults(start: object) -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    blocked = _mask_in(start)
    assert {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD} <= blocked
    assert not {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL} & blocked
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before  # the caller's, as it was


def test_a_daemon_runs_its_target_with_its_arguments() -> None:
    got: list[object] = []
    thread = _threads.daemon(lambda *a: got.extend(a), 1, "two", name="redlease-test")
    thread.join(5)
    assert got == [1, "two"]
    assert thread.daemon
    assert thread.name == "redlease-test"


def _interrupt_after(c_function: str, nth: int) -> None:
    """Raise KeyboardInterrupt as the ``nth`` call of the C function ``c_function`` in
    this thread returns: what an error raised by a pending signal handler does there
    (CPython runs pending handlers as a builtin's call returns)."""
    seen = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal seen
        if event == "c_return" and getattr(arg, "__name__", "") == c_function:
            seen += 1
            if seen == nth:
                sys.setprofile(None)
                raise KeyboardInterrupt

    sys.setprofile(profile)


@pytest.mark.parametrize("nth", [1, 2, 3])
def test_an_interruption_at_any_step_leaves_the_callers_mask_as_it_was(nth: int) -> None:
    """The first cut blocked, then entered its try: an interrupt as the block returned
    left the main thread blocking SIGINT and SIGALRM for good (the random-interrupt test
    saw its interrupts stop landing)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    thread = threading.Thread(target=lambda: None)
    _interrupt_after("pthread_sigmask", nth)
    try:
        with pytest.raises(KeyboardInterrupt):
            _threads.start(thread)
    finally:
        sys.setprofile(None)
        if thread.ident is not None:
            thread.join(5)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
