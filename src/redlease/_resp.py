"""RESP encoding of the core's operations, shared by both drivers.

The lock's commands are short lists of str; packing them here (in C when hiredis is
installed) skips redis-py's general-purpose argument handling on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._flows import Call, Command

Pack = Callable[[tuple[str, ...]], bytes]


def _pack_python(parts: tuple[str, ...]) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


pack: Pack = _pack_python
try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is optional
    pass
else:
    pack = hiredis.pack_command  # type: ignore[assignment]


def evalsha(op: Call) -> bytes:
    return pack(("EVALSHA", op.script.sha, str(len(op.keys)), *op.keys, *op.args))


def eval_source(op: Call) -> bytes:
    return pack(("EVAL", op.script.source, str(len(op.keys)), *op.keys, *op.args))


def command(args: tuple[str, ...]) -> bytes:
    return pack(args)


_COMMAND, _EVALSHA, _EVAL = 0, 1, 2


def _command_bytes(op: Command) -> bytes:
    return command(op.args)


_PACKERS: tuple[Callable[[Any], bytes], ...] = (_command_bytes, evalsha, eval_source)


class Wire:
    """How ops go on the wire to one server, which remembers the scripts it was sent.

    A script goes as EVALSHA, or as EVAL with its source the first time this server is
    sent it: no NOSCRIPT round trip, which in a Redlock fan-out would eat the other
    nodes' time. (A server that lost its scripts answers NOSCRIPT later; the driver
    falls back to EVAL then.)"""

    def __init__(self) -> None:
        self._loaded: set[str] = set()

    def forget(self) -> None:
        """Send every script with its source again: the server answered NOSCRIPT to a
        reply nobody waited for, or a connection to it failed (it may have restarted)."""
        self._loaded.clear()

    def __call__(self, op: Call | Command, packed: dict[int, bytes] | None = None) -> bytes:
        """``op`` as bytes for this server; ``packed`` keeps each form once packed, for
        the other servers of a fan-out."""
        if isinstance(op, Command):
            form = _COMMAND
        elif op.script.sha in self._loaded:
            form = _EVALSHA
        else:
            self._loaded.add(op.script.sha)
            form = _EVAL
        if packed is None:
            return _PACKERS[form](op)
        data = packed.get(form)
        if data is None:
            data = packed[form] = _PACKERS[form](op)
        return data


def private_connection_settings(pool_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The settings of the drivers' own connections: the client's, so TLS, ACL users and
    Sentinel discovery apply, minus what costs a round trip and means nothing to a lock.

    A new connection must cost no round trip beyond TCP's (AUTH and SELECT when
    configured): each one counts against the op's bound and a lease's elapsed time, and
    on a slow link a Redlock node's whole timeout. So no CLIENT SETINFO (a label in
    CLIENT LIST), and RESP2 unless the client asked for RESP3 (redis-py 8 would otherwise
    send HELLO 3 and CLIENT MAINT_NOTIFICATIONS first). Maintenance notifications need
    RESP3 (redis-py 8 refuses them on a RESP2 connection without hiredis); these
    connections live for a few commands and do without."""
    settings = dict(pool_kwargs)
    for key in ("driver_info", "lib_name", "lib_version"):
        if key in settings:
            settings[key] = None
    if settings.get("protocol") is None:
        settings["protocol"] = 2
        if "maint_notifications_config" in settings:
            settings["maint_notifications_config"] = None
    return settings


def bounded(settings: dict[str, Any], timeout: float, no_retry: object) -> dict[str, Any]:
    """``settings`` for one new connection: its handshake and reads bounded by the op's
    ``timeout``, and no client retries (a retry would stretch that bound, and a lease's
    elapsed-time accounting, several times over)."""
    kwargs = dict(settings)
    kwargs["retry"] = no_retry
    for key in ("socket_timeout", "socket_connect_timeout"):
        configured = kwargs.get(key)
        kwargs[key] = timeout if configured is None else min(configured, timeout)
    return kwargs
