"""The operator's subcommands: ``inspect`` (alias ``status``), ``list`` and
``release --force``. Each reads a name through one read-only script (``_rules.inspect``), so
what it prints is one instant of the server's state; tokens are shown by their first
characters only (a full token would let whoever reads a log release the lock).
With several ``--redis`` (a Redlock's nodes) each server is shown on its own.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from typing import Any, TextIO

from .._rules.inspect import KINDS, Holder, LockInfo, Waiter, held_at
from .._rules.keys import every_lock
from .._rules.lease import SHOWN
from .._rules.lease import short_token as short  # (the library's logs show tokens so too)
from .._rules.once import Period
from .._sync.inspect import read_info, read_period
from .common import EXIT_FREE, EXIT_USAGE, CliError, Reporter, make_client


def _seconds(value: float | None) -> str:
    return "no TTL: never expires" if value is None else f"{value:.3f} s left"


# JSON is for programs: a token's first characters as they are (no ellipsis), and every
# duration in seconds, to the millisecond.
def _holder_json(h: Holder) -> dict[str, Any]:
    remaining = None if h.remaining is None else round(h.remaining, 3)
    return {"token": h.token[:SHOWN], "remaining": remaining, "mode": h.mode, "fence": h.fence}


def _waiter_json(w: Waiter) -> dict[str, Any]:
    return {"token": w.token[:SHOWN], "live": w.live, "remaining": round(w.remaining, 3)}


def info_json(info: LockInfo, url: str) -> dict[str, Any]:
    return {
        "server": url,
        "name": info.name,
        "kind": info.kind,
        "held": info.held,
        "holders": [_holder_json(h) for h in info.holders],
        "fence": info.fence,
        "live_waiters": info.live_waiters,
        "waiters": [_waiter_json(w) for w in info.waiters],
    }


def _write_info(info: LockInfo, out: TextIO, period: Period | None = None) -> None:
    state = "held" if info.held else "free"
    if period is not None:
        state += (
            f"; a scheduled job's run of this period began (run {short(period.run)}), "
            f"the next period begins in {period.next_in:.3f} s"
        )
    out.write(f"{info.kind} {info.name!r}: {state}\n")
    for h in info.holders:
        fence = "" if h.fence is None else f", fence {h.fence}"
        warn = "WARNING: " if h.remaining is None else ""
        out.write(f"  holder {short(h.token)} ({h.mode}): {warn}{_seconds(h.remaining)}{fence}\n")
    if info.fence is None:
        out.write("fence counter: none (the next holder's starts at the server's clock)\n")
    else:
        out.write(f"fence counter: {info.fence} (the next holder gets more)\n")
    dead = len(info.waiters) - info.live_waiters
    out.write(f"waiting: {info.live_waiters}" + (f" (and {dead} expired entries)" if dead else ""))
    out.write("\n")
    for i, w in enumerate(info.waiters, 1):
        if w.live:
            out.write(f"  {i}. {short(w.token)} live, its entry good for {w.remaining:.3f} s\n")
        else:
            out.write(f"  {i}. {short(w.token)} expired {-w.remaining:.3f} s ago (gone)\n")


def _read(url: str, name: str, kind: str, prefix: str) -> tuple[LockInfo, Period | None]:
    client = make_client(url)
    try:
        info = read_info(client, name, kind=kind, prefix=prefix)
        return info, (read_period(client, name, prefix=prefix) if kind == "lock" else None)
    finally:
        client.close()


def _checked_name(args: argparse.Namespace, what: str) -> None:
    from .._base.errors import InvalidArgument
    from .._rules.arguments import key_prefix, lock_name

    try:
        lock_name(args.name)
        key_prefix(args.prefix)
    except InvalidArgument as exc:
        raise CliError(f"{what}: {exc}") from None


# --------------------------------------------------------------------------- inspect


def inspect(args: argparse.Namespace, urls: list[str], out: TextIO) -> int:
    _checked_name(args, "inspect")
    read = [(url, *_read(url, args.name, args.kind, args.prefix)) for url in urls]
    infos = [(url, info) for url, info, _ in read]
    held = any(info.held for _, info in infos)
    if args.json:
        shown = [
            {**info_json(info, url), "period": _period_json(period)} for url, info, period in read
        ]
        doc: Any = shown[0] if len(shown) == 1 else {"name": args.name, "held": held}
        if len(shown) > 1:
            doc["servers"] = shown
        out.write(json.dumps(doc) + "\n")
    else:
        for url, info, period in read:
            if len(infos) > 1:
                out.write(f"== {url}\n")
            _write_info(info, out, period)
    return 0 if held else EXIT_FREE


def _period_json(period: Period | None) -> dict[str, Any] | None:
    if period is None:
        return None
    return {"run": period.run[:SHOWN], "next_in": round(period.next_in, 3)}


# --------------------------------------------------------------------------- list


def held_names(
    client: Any, prefix: str, pattern: str, kinds: tuple[str, ...]
) -> list[tuple[str, str]]:
    """(kind, name) of each lock key under ``prefix`` whose name matches the glob, sorted.
    Uses SCAN (never KEYS, which would stall the server on a large keyspace)."""
    found = set()
    for key in client.scan_iter(match=every_lock(prefix), count=1000):
        text = key.decode() if isinstance(key, bytes) else str(key)
        held = held_at(text, prefix)
        if held is not None and held[0] in kinds and fnmatch.fnmatchcase(held[1], pattern):
            found.add(held)
    return sorted(found, key=lambda kn: (kn[1], kn[0]))


def _warn(args: argparse.Namespace, text: str) -> None:
    """A warning of the listing's, on stderr: a line, or a JSON event with ``--json``."""
    Reporter(args.pattern, args.json).say("warning", f"warning: {text}", message=text)


def listing(args: argparse.Namespace, urls: list[str], out: TextIO) -> int:
    from .._base.errors import BackendError, InvalidArgument
    from .._clients.errors import backend_failures
    from .._rules.arguments import key_prefix
    from .._rules.classify import error_code
    from .._wire.endpoint import endpoint_of
    from .._wire.errors import backend_error

    try:
        key_prefix(args.prefix)
    except InvalidArgument as exc:
        raise CliError(f"list: {exc}") from None
    kinds = tuple(KINDS) if args.kind == "all" else (args.kind,)
    rows: list[tuple[str, LockInfo]] = []
    for url in urls:
        client = make_client(url)
        try:
            try:
                found = held_names(client, args.prefix, args.pattern, kinds)
            except backend_failures() as exc:  # (the client's own errors, from SCAN)
                label = endpoint_of(client, asyncio=False).label
                raise backend_error(exc, "list", server=label) from exc
            for kind, name in found:
                try:
                    info = read_info(client, name, kind=kind, prefix=args.prefix)
                except BackendError as exc:
                    if error_code(exc) != "WRONGTYPE":
                        raise
                    _warn(args, f"{kind} {name!r} on {url} not listed: {exc}")
                    continue
                if info.held:  # (released between the SCAN and the read: not listed)
                    rows.append((url, info))
        finally:
            client.close()
    if args.json:
        out.write(json.dumps([info_json(info, url) for url, info in rows]) + "\n")
    elif rows:
        several = len(urls) > 1
        header = ("SERVER\t" if several else "") + "KIND\tNAME\tLEFT\tFENCE\tWAITING\tHOLDERS"
        out.write(header + "\n")
        for url, info in rows:
            lefts = [h.remaining for h in info.holders]
            left = "none" if None in lefts else f"{max(x for x in lefts if x is not None):.3f}s"
            fence = "-" if info.fence is None else str(info.fence)
            line = f"{info.kind}\t{info.name}\t{left}\t{fence}\t{info.live_waiters}\t"
            line += ",".join(short(h.token) for h in info.holders)
            out.write((f"{url}\t" if several else "") + line + "\n")
    else:  # (said on stderr: stdout stays empty for scripts that read the table)
        what = "lock" if args.kind == "all" else args.kind
        print(
            f"redlease: no {what} held under the prefix {args.prefix!r} matching {args.pattern!r}",
            file=sys.stderr,
        )
    return 0 if rows else EXIT_FREE


# --------------------------------------------------------------------------- release


def _confirm(question: str) -> bool:
    print(question + " [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def force_release(args: argparse.Namespace, urls: list[str], out: TextIO) -> int:
    if not args.force:
        raise CliError(
            "release: --force is required: it frees the lock whatever its holder, who may "
            "still be working under it (its writes are then stopped only by fencing)"
        )
    _checked_name(args, "release")
    infos = [(url, _read(url, args.name, args.kind, args.prefix)[0]) for url in urls]
    held = [(url, info) for url, info in infos if info.held]
    if not held:
        _report(args, out, [], f"{args.kind} {args.name!r} is free: nothing to release")
        return EXIT_FREE
    if not args.yes:
        if not sys.stdin.isatty():
            raise CliError("release: refusing without a terminal to confirm on: pass --yes")
        holders = ", ".join(
            f"{short(h.token)} ({_seconds(h.remaining)})" for _, i in held for h in i.holders
        )
        if not _confirm(f"Free {args.kind} {args.name!r}, held by {holders}?"):
            raise CliError("release: not confirmed; nothing was changed", EXIT_USAGE)
    removed = []
    for url, info in held:
        for h in info.holders:
            if _release_one(url, args, h.token):
                removed.append((url, h))
    lines = [
        f"released {args.kind} {args.name!r}: holder {short(h.token)} ({h.mode}"
        + ("" if h.fence is None else f", fence {h.fence}")
        + ")"
        + (f" on {url}" if len(urls) > 1 else "")
        for url, h in removed
    ]
    _report(args, out, [{"server": url, **_holder_json(h)} for url, h in removed], *lines)
    return 0 if removed else EXIT_FREE


def _report(args: argparse.Namespace, out: TextIO, removed: list[Any], *lines: str) -> None:
    if args.json:
        out.write(json.dumps({"name": args.name, "kind": args.kind, "removed": removed}) + "\n")
    else:
        for line in lines:
            out.write(line + "\n")


def _release_one(url: str, args: argparse.Namespace, token: str) -> bool:
    """Release the hold ``token`` as its holder would (the next waiter is served at once;
    the fence counter is untouched, so later fences stay greater); False if it ended
    meanwhile."""
    from .._base.errors import LockLost
    from .._sync.inspect import release_by_force

    client = make_client(url)
    try:
        release_by_force(client, args.name, token, kind=args.kind, prefix=args.prefix)
    except LockLost:
        return False
    else:
        return True
    finally:
        client.close()
