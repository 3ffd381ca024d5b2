"""RESP encoding of the core's operations, shared by both drivers.

The lock's commands are short lists of str; packing them here (in C when hiredis is
installed) skips redis-py's general-purpose argument handling on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable

from ._flows import Call

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
