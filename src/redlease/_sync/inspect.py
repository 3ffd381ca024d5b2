# Generated from _async/inspect.py by scripts/unasync.py: edit that file, then run
# `python scripts/unasync.py` (the tests run it with --check).
"""What an operator does to a name given by its parts: ``read_info``, one read of what
it holds and who waits for it; ``release_by_force``, which ends one hold (the rules,
and what the replies mean, are in ``_rules.inspect``); ``read_period``, a scheduled job's
record of its period's run (``_rules.once``). Written once, as asyncio code;
``scripts/unasync.py`` generates the blocking twin (``_sync.inspect``)."""

from __future__ import annotations

from typing import Any

from .._clients.checks import check_client
from .._rules.inspect import READ_TIMEOUT, TWINS, LockInfo, checked, forced_release, inspect
from .._rules.once import Period, last_period
from .backend import ASYNC
from .io import IO


def read_info(client: Any, name: str, *, kind: str = "lock", prefix: str = "redlease:") -> LockInfo:
    """What the ``kind`` named ``name`` holds and who waits for it, now (a client of this
    flavour: standalone, Sentinel's ``master_for``, Cluster). One read-only script run.
    Raises InvalidArgument for a bad ``name``, ``prefix`` or ``kind``, or a client it
    cannot serve; BackendError if the server fails."""
    check_client(client, want_async=ASYNC, **TWINS)
    keys, name, kind = checked(name, kind, prefix)
    flow = inspect(keys, name, kind, READ_TIMEOUT)
    return IO(client).run(flow, f"inspect {name!r}")


def release_by_force(
    client: Any, name: str, token: str, *, kind: str = "lock", prefix: str = "redlease:"
) -> None:
    """End the hold ``token`` of the ``kind`` named ``name`` as its holder would, as an
    operator does (``redlease release --force``): the next waiter is served at once, the
    fence counter is untouched, an election's observers are told. LockLost if that hold
    had ended; InvalidArgument and BackendError as ``read_info``."""
    check_client(client, want_async=ASYNC, **_twins("release_by_force"))
    flow = forced_release(name, kind, prefix, token)
    IO(client).run(flow, f"release {name!r}")


def read_period(client: Any, name: str, *, prefix: str = "redlease:") -> Period | None:
    """The record a scheduled job of ``name`` keeps of its period's run (``every=``),
    if any: the run that made it, and when the next period begins. InvalidArgument and
    BackendError as ``read_info``."""
    check_client(client, want_async=ASYNC, **_twins("read_period"))
    flow = last_period(name, prefix, READ_TIMEOUT)
    return IO(client).run(flow, f"inspect {name!r}")


def _twins(name: str) -> dict[str, str]:
    """The flavours of an operator's function, for the error that names a client of the
    other flavour (both twins have the one name)."""
    return {"sync_twin": f"the blocking {name}", "async_twin": f"the asyncio {name}"}
