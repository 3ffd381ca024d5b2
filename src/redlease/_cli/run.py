"""``redlease run``: a command run under a lease, the way ``flock(1)`` runs one under a
file lock, and kept under it until it has ended.

The command runs in a process group of its own, so a signal reaches all of it (a shell
script and the programs it started). What redlease does with it:

* a SIGTERM, SIGINT or SIGHUP sent to redlease is passed on to the command's group, and
  redlease waits for the command to end before it releases the lease: the lease is held
  for as long as any of the command runs, and the command never runs unlocked because
  its wrapper was told to stop (``timeout 2 redlease run ...`` stops both, in order);
* a lease lost while the command runs (``--on-lost stop``, the default) sends SIGTERM to
  the group, SIGKILL after ``--grace`` if it is still there, and exits with
  ``--lost-exit-code`` (75, EX_TEMPFAIL: try again later). ``--on-lost warn`` only says
  so and lets the command finish (the exit code is still the lost one).

On a terminal (redlease in its foreground), the command stays in redlease's group so it
keeps the terminal: Ctrl-C reaches both from the terminal itself, and only SIGTERM and
SIGHUP are passed on, to the command's own process.

A redlease killed with -9 can do none of this: its lease then runs out after the ttl
while the command may still run. Fencing (``REDLEASE_FENCE``) is what protects a
resource from that.

What it holds (a lock, a Redlock over several ``--redis``, a semaphore's permit,
leadership, a scheduled job's run) is chosen from its arguments by ``run_from_args``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._base import threads as _threads
from .._base.errors import LockError
from .common import CliError, Reporter, make_client
from .signals import handled

if TYPE_CHECKING:
    import argparse

PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# After a signal, the release that follows the command's end is given this long; a server
# that has not answered by then is left to let the lease run out (its ttl), so that a
# hung server cannot keep a stopped `redlease run` alive.
SIGNALLED_RELEASE = 1.0

DEFAULT_RUN_TTL = 30.0  # `run`'s lease, renewed while the command runs
# `run` on one server, waiting without -w, first asks it for a PONG, within
# ANSWER_WITHIN seconds: one that accepts connections and never answers (hung, or
# another service that waits for more) is given up on then (a wait with no bound of its
# own would wait out twice the ttl), and said to be waited for after SAY_WAITING.
ANSWER_WITHIN = 5.0
SAY_WAITING = 2.0


@dataclass(frozen=True)
class RunOptions:
    name: str
    ttl: float
    timeout: float | None  # None: wait; 0: one try
    conflict_exit_code: int
    lost_exit_code: int
    on_lost: str  # "stop" or "warn"
    grace: float
    as_json: bool


class SkippedRun(Exception):
    """A scheduled job's call skipped (``redlease.Skipped``): exits with the conflict
    code, saying why."""

    def __init__(self, skipped: Any) -> None:
        from .._rules.once import skip_message

        super().__init__(skip_message(skipped))
        self.skipped = skipped


class Interrupted(BaseException):
    """A signal that came before the command started: stop waiting for the lease. Not an
    Exception, as KeyboardInterrupt is not: nothing on the way catches it as a failure,
    and an acquire it interrupts cleans up in haste (a hung server cannot hold it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def in_terminal_foreground() -> bool:
    """Whether redlease runs in its terminal's foreground group (an interactive run)."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


class Supervisor:
    """The command's process (group): started once, signalled, stopped with a grace."""

    def __init__(self, interactive: bool) -> None:
        self.interactive = interactive
        self.child: subprocess.Popen[bytes] | None = None
        self._stopping: threading.Timer | None = None
        self._lock = threading.Lock()

    def start(self, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        options: dict[str, Any] = {}
        if not self.interactive:
            if sys.version_info >= (3, 11):
                options["process_group"] = 0
            else:  # pragma: no cover - Python 3.10
                options["start_new_session"] = True
        self.child = subprocess.Popen(cmd, env=env, **options)
        return self.child

    def send(self, signum: int) -> None:
        """Send ``signum`` to the command (its group), if it still runs."""
        child = self.child
        if child is None or child.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.interactive:
                os.kill(child.pid, signum)
            else:
                os.killpg(child.pid, signum)

    def stop(self, grace: float) -> None:
        """SIGTERM now, SIGKILL after ``grace`` seconds if the command is still there."""
        with self._lock:
            if self._stopping is not None:
                return
            self._stopping = threading.Timer(grace, self.send, args=(signal.SIGKILL,))
            self._stopping.daemon = True
            _threads.start(self._stopping)
        self.send(signal.SIGTERM)

    def wait(self) -> int:
        assert self.child is not None
        code = self.child.wait()
        with self._lock:
            if self._stopping is not None:
                self._stopping.cancel()
        return code if code >= 0 else 128 - code  # killed by a signal: the shell's way


def run_under(
    hold: Callable[[Callable[[str], None]], tuple[Callable[[float | None], Any], Any]],
    cmd: list[str],
    options: RunOptions,
    what: str,
) -> int:
    """Run ``cmd`` under a lease: ``hold(on_lost)`` makes the lock (whose loss of a lease
    calls ``on_lost(reason)``) and returns its ``take(timeout)`` and ``give_back(lease)``.
    Returns the exit code."""
    from .._base.errors import AcquireTimeout, BackendError, LockLost

    report = Reporter(options.name, options.as_json)
    supervisor = Supervisor(in_terminal_foreground())
    state: dict[str, Any] = {"phase": "taking", "lost": False, "signal": None, "signalled": False}

    def on_lost(reason: str) -> None:
        if state["lost"]:
            return
        state["lost"] = True
        stopping = options.on_lost == "stop" and state["phase"] == "running"
        report.say(
            "lost",
            f"lost {what} {options.name!r} while the command ran: {reason}"
            + (f"; stopping it (SIGKILL after {options.grace:g} s)" if stopping else ""),
            reason=reason,
            stopping=stopping,
        )
        if stopping:
            supervisor.stop(options.grace)

    def on_signal(signum: int) -> None:
        first, state["signalled"] = not state["signalled"], True
        if state["phase"] == "taking":
            if first:  # (a second signal while the first unwinds the wait: it says enough)
                raise Interrupted(signum)
            return
        if supervisor.child is None:
            state["signal"] = signum  # between the grant and the start: do not start
        elif not (supervisor.interactive and signum == signal.SIGINT):
            supervisor.send(signum)  # (on a terminal, Ctrl-C reached the command itself)

    take, give_back = hold(on_lost)
    with handled(PASSED_ON, on_signal):  # (it raises Interrupted while the lease is taken)
        lease = None
        try:
            lease = take(options.timeout)
            state["phase"] = "running"
        except SkippedRun as skip:
            report.say(
                "busy",
                f"{skip}; the command was not run",
                reason=skip.skipped.reason,
                retry_in=skip.skipped.retry_in,
            )
            return options.conflict_exit_code
        except AcquireTimeout:
            waited = "one try" if options.timeout == 0 else f"{options.timeout:g} s"
            report.say(
                "busy",
                f"{what} {options.name!r} is held by others; gave up after {waited} "
                "without running the command",
            )
            return options.conflict_exit_code
        except Interrupted as exc:
            if lease is None:
                report.say("interrupted", f"{exc} while waiting for {what} {options.name!r}")
                return 128 + exc.signum
            # It came as the lease was handed over: not started, given back below.
            state["phase"], state["signal"] = "running", exc.signum
        try:
            code = _run_command(supervisor, cmd, lease, options, what, report, state)
        finally:
            state["phase"] = "releasing"
            if supervisor.child is None:  # the command never started (a signal, no CMD)
                give_back = _given_up(give_back)
            try:
                if state["signalled"]:
                    _release_within(SIGNALLED_RELEASE, give_back, lease, report, what, options)
                else:
                    give_back(lease)
            except LockLost as exc:
                on_lost(str(exc))
            except BackendError:
                # A lease already lost (often because its server is out of reach) has
                # nothing left to release: the exit code is still the lost one, not 2.
                if not state["lost"]:
                    raise
    if state["lost"]:
        code = options.lost_exit_code
    report.say("exit", None, code=code, lost=state["lost"])
    return code


def _given_up(give_back: Callable[[Any], None]) -> Callable[[Any], None]:
    """What gives a lease back when its command never started: a scheduled job's run is
    abandoned (its name and its period freed, as if it had never been granted), any
    other lease given back as usual."""

    from .. import Run

    def give_up(lease: Any) -> None:
        if isinstance(lease, Run):
            lease.abandon()
        else:
            give_back(lease)

    return give_up


def _release_within(
    bound: float,
    give_back: Callable[[Any], None],
    lease: Any,
    report: Reporter,
    what: str,
    options: RunOptions,
) -> None:
    """``give_back(lease)``, waited for ``bound`` seconds at most (the process is being
    stopped); raises what it raised. Not done by then: left to its ttl, and said so."""
    outcome: list[BaseException | None] = []

    def release() -> None:
        try:
            give_back(lease)
        except BaseException as exc:  # handed to the caller below
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = _threads.daemon(release, name="redlease-release")
    thread.join(bound)
    if not outcome:
        report.say(
            "left",
            f"the server did not answer the release of {what} {options.name!r} within "
            f"{bound:g} s: it ends with its ttl",
        )
        return
    if outcome[0] is not None:
        raise outcome[0]


def _run_command(
    supervisor: Supervisor,
    cmd: list[str],
    lease: Any,
    options: RunOptions,
    what: str,
    report: Reporter,
    state: dict[str, Any],
) -> int:
    verb = "leading" if what == "election" else f"holding {what}"
    report.say("acquired", f"{verb} {options.name!r}, fence {lease.fence}", fence=lease.fence)
    if state["signal"] is not None:
        return 128 + int(state["signal"])
    env = dict(os.environ, REDLEASE_FENCE=str(lease.fence), REDLEASE_LOCK=options.name)
    try:
        supervisor.start(cmd, env)
    except OSError as exc:
        why = f"cannot run {cmd[0]!r}: {exc.strerror or exc}"
        report.say("error", why, message=why)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    if state["signal"] is not None:  # it came while the command was being started
        supervisor.send(int(state["signal"]))
    return supervisor.wait()


# --------------------------------------------------------------------------- setup


def run_from_args(args: argparse.Namespace, urls: list[str], cmd: list[str]) -> int:
    """``redlease run``, as its arguments say (``urls``: its servers): the options
    checked, the clients made, the primitive chosen, ``cmd`` run under it."""
    from .. import Election, InvalidArgument, Lock, Once, Redlock, Semaphore

    if len(urls) > 1 and (args.semaphore is not None or args.elect):
        raise CliError("run: --semaphore and --elect take one server (one --redis)")
    if args.elect and args.on_lost == "warn":
        raise CliError("run: --elect always stops CMD when leadership is lost")
    scheduled = args.at_least is not None or args.every is not None
    if scheduled:
        if len(urls) > 1 or args.semaphore is not None or args.elect:
            raise CliError("run: --at-least and --every take one server, and a lock")
        if args.timeout is not None:
            raise CliError("run: a scheduled job (--at-least, --every) never waits: drop -w")
        if args.ttl is None:
            raise CliError(
                "run: a scheduled job (--at-least, --every) needs --ttl: the most a run may "
                "hold the name (a command still running then is stopped)"
            )
        if args.at_least is not None and args.at_least > args.ttl:
            raise CliError("run: --at-least must not exceed --ttl (the most a run holds it)")
    ttl = DEFAULT_RUN_TTL if args.ttl is None else args.ttl
    clients = [make_client(url) for url in urls]
    options = RunOptions(
        name=args.name,
        ttl=ttl,
        timeout=0.0 if args.nonblock or scheduled else args.timeout,
        conflict_exit_code=args.conflict_exit_code,
        lost_exit_code=args.lost_exit_code,
        on_lost="stop" if args.elect else args.on_lost,
        grace=args.grace,
        as_json=args.json,
    )
    what = "lock"
    if scheduled:
        what = "scheduled job"
    elif args.elect:
        what = "election"
    elif args.semaphore is not None:
        what = f"a permit of the semaphore (limit {args.semaphore})"
    elif len(clients) > 1:
        what = f"the Redlock over {len(clients)} servers"

    def hold(on_lost: Any) -> tuple[Any, Any]:
        def lost(lease: Any) -> None:
            on_lost(lease.lost_reason or "it was found lost")

        common: dict[str, Any] = {"ttl": ttl, "prefix": args.prefix, "on_lost": lost}
        if args.elect:
            election = Election(clients[0], args.name, **common)

            def resign(lease: Any) -> None:
                election.resign()  # hands over at once, and tells the observers

            return election.campaign, resign
        if scheduled:
            job = Once(
                clients[0],
                args.name,
                at_most=ttl,
                at_least=args.at_least or 0,
                every=args.every,
                on_lost=lost,
                prefix=args.prefix,
            )
            return _scheduled(job), _release
        if args.semaphore is not None:
            sem = Semaphore(clients[0], args.name, args.semaphore, auto_renew=True, **common)
            return sem.acquire, _release
        if len(clients) > 1:
            return Redlock(clients, args.name, auto_renew=True, **common).acquire, _release
        return Lock(clients[0], args.name, auto_renew=True, **common).acquire, _release

    def answered_first(on_lost: Any) -> tuple[Any, Any]:
        take, give_back = hold(on_lost)
        if len(clients) > 1 or options.timeout is not None:
            # (a Redlock's quorum rides out a silent node; -n and -w bound the wait)
            return take, give_back

        def take_answered(timeout: float | None) -> Any:
            _answers(clients[0], args.name, as_json=args.json)
            return take(timeout)

        return take_answered, give_back

    try:
        return run_under(answered_first, cmd, options, what)
    except InvalidArgument as exc:
        raise CliError(f"run: {exc}") from None
    finally:
        for client in clients:
            client.close()


def _release(lease: Any) -> None:
    lease.release()


def _answers(client: Any, name: str, *, as_json: bool) -> None:
    """Return once the server has answered a PING; BackendError if it has not within
    ANSWER_WITHIN seconds. Past SAY_WAITING, says what it waits for."""
    from .._rules.classify import error_code
    from .._rules.ops import Command
    from .._sync.io import IO

    io = IO(client)

    def ping() -> Any:
        return (yield Command(("PING",), ANSWER_WITHIN, patient=False))

    def say() -> None:
        Reporter(name, as_json).say(
            "waiting",
            f"waiting for {io.describe()} to answer (nothing yet in {SAY_WAITING:g} s; "
            f"giving up at {ANSWER_WITHIN:g} s)",
            server=io.describe(),
        )

    timer = threading.Timer(SAY_WAITING, say)
    timer.daemon = True
    _threads.start(timer)
    try:
        io.run(ping(), f"reach the server for {name!r}")
    except LockError as refused:
        if not error_code(refused):  # (a refusal, NOPERM say, is an answer: it is there)
            raise
    finally:
        timer.cancel()


def _scheduled(job: Any) -> Any:
    """A scheduled job's take: its one try; a skip raises SkippedRun (the conflict code,
    with the skip's words)."""
    from .. import Skipped

    def take(timeout: float | None) -> Any:
        run = job.begin()
        if isinstance(run, Skipped):
            raise SkippedRun(run)
        return run

    return take
