"""``_base.fork``: what a forked child runs before anything else, and what it holds."""

from __future__ import annotations

import gc
import os
import sys

import pytest

from redlease._base import fork as _fork


class Owner:
    def __init__(self) -> None:
        self.renewed_in = 0
        _fork.renew_in_child(self.renew)

    def renew(self) -> None:
        self.renewed_in = os.getpid()


def test_an_object_registered_for_the_child_is_held_weakly() -> None:
    before = set(_fork._METHODS)
    owner = Owner()
    added = set(_fork._METHODS) - before
    assert len(added) == 1
    del owner
    gc.collect()
    assert not added & _fork._METHODS  # its entry went with it


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
@pytest.mark.skipif(sys.platform == "darwin", reason="fork with threads is unsafe there")
def test_a_child_renews_each_live_object_and_frees_thread_locks() -> None:
    owner, lock = Owner(), _fork.thread_lock()
    generation = _fork.generation
    read, write = os.pipe()
    with lock:  # taken at the fork: the child must find it free
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                free = lock.acquire(blocking=False)
                said = f"{owner.renewed_in == os.getpid()} {free} {_fork.generation}"
                os.write(write, said.encode())
            finally:
                os._exit(0)
    os.close(write)
    with os.fdopen(read) as reply:
        said = reply.read()
    os.waitpid(pid, 0)
    assert said == f"True True {generation + 1}"
    assert owner.renewed_in == 0  # the parent runs nothing
