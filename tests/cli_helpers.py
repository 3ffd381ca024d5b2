"""The ``redlease`` command as the CLI tests start it: a subprocess of this interpreter,
its output read as text, nothing on its standard input."""

from __future__ import annotations

import os
import subprocess
import sys

REDLEASE = [sys.executable, "-m", "redlease"]


def start(argv: list[str], **env: str) -> subprocess.Popen[str]:
    """``redlease *argv``, started, with ``env`` added to this process's environment."""
    return subprocess.Popen(
        [*REDLEASE, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **env},
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    """Its exit code, standard output and standard error, once it has ended."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err
