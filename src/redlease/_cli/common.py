"""What the command's modules share (``_cli.command``, ``_cli.run``, ``_cli.operate``): the exit
codes, the one-line failure, redlease's own messages, and the client a URL names."""

from __future__ import annotations

import json
import sys
from typing import Any

EXIT_CONFLICT = 1  # flock's default for a lock that stayed busy
EXIT_FREE = 1  # inspect, list and release: nothing there
EXIT_USAGE = 2
EXIT_LOST = 75  # sysexits' EX_TEMPFAIL: the lease was lost while the command ran


class CliError(Exception):
    """A failure to report in one line, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def make_client(url: str) -> Any:
    """A client for ``url``; nothing is sent yet (a server that cannot be reached is met
    at the first command; ``run``'s first PING takes a refusal for an answer, so a
    least-privileged user needs no +ping)."""
    from .._clients import from_url

    try:
        return from_url(url)
    except ValueError as exc:
        raise CliError(f"--redis: {exc}") from None


class Reporter:
    """redlease's own words while a command runs: lines on stderr (the command owns
    stdout), or one JSON object a line with ``--json``."""

    def __init__(self, name: str, as_json: bool) -> None:
        self.name = name
        self.as_json = as_json

    def say(self, event: str, text: str | None, **fields: Any) -> None:
        """Report ``event``; a text of None is for ``--json`` only (a job run by cron
        that ended as it should then prints one line, not two)."""
        if self.as_json:
            line = json.dumps({"event": event, "name": self.name, **fields})
        elif text is not None:
            line = f"redlease: {text}"
        else:
            return
        print(line, file=sys.stderr, flush=True)
