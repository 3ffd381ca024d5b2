"""Fuzzing every public constructor and method with generated arguments, against a real
server: each call works or raises InvalidArgument naming the argument fuzzed. Never
another exception, never a hang; a refused call leaves no key behind, and no key is left
without a TTL.

A case fuzzes one argument (the others valid, or set so that the one fuzzed means
something: ``max_hold`` with or without ``auto_renew``...), then takes the lock every way
there is, uses each lease and gives it back. Values straddle each range's edges and mix in
nasty ones. Nothing waits long: the locks are free, but in the cases of ``acquire``'s
``timeout``, which wait for a holder that lets go after ``HOLD_FOR``, and a call with
``replicas=`` waits for replicas the server does not have (``WAIT``, a tenth of a second).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import itertools
import math
import re
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from datetime import timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import redlease
from families import ClientFamily
from redlease import AcquireTimeout, BackendError, InvalidArgument, LockLost, QuorumError
from redlease.testing import FakeClock
from redlease.tools import servers

# Redlock over fewer than three nodes may warn: that is not what this file is about.
pytestmark = pytest.mark.filterwarnings("ignore::redlease.RedleaseWarning")

BASE_TTL = 5.0  # no lease of this length runs out between two calls, even on a busy machine
SHORT_WAIT = 0.05  # the bound of every acquire that is not the one fuzzed
HOLD_FOR = 0.01  # how long a holder keeps the lock that a fuzzed acquire waits for
HUNG = 10.0  # a case takes milliseconds: one still running after this is hung
MAY_LOSE = 1.0  # a lease shorter than this may run out between two calls...
MAY_BE_LATE = 0.05  # ...and shorter than this, its grant may come too late to be valid
SLOW_NODES = 0.02  # a Redlock node_timeout under this may miss replies of a healthy server
NODE_DBS = (1, 2, 3, 4, 5)  # Redlock's nodes: databases of the one server, distinct nodes
EXAMPLES = {"Lock": 300, "AsyncLock": 300, "Redlock": 200, "AsyncRedlock": 200}
EXAMPLES |= {"Semaphore": 150, "AsyncSemaphore": 150}
_TAGS = itertools.count()  # see Env.tag

CLASSES: dict[str, Any] = {
    "Lock": redlease.Lock,
    "AsyncLock": redlease.AsyncLock,
    "Redlock": redlease.Redlock,
    "AsyncRedlock": redlease.AsyncRedlock,
    "Semaphore": redlease.Semaphore,
    "AsyncSemaphore": redlease.AsyncSemaphore,
}
LEASES: dict[str, Any] = {
    "Lock": redlease.Lease,
    "AsyncLock": redlease.AsyncLease,
    "Redlock": redlease.RedlockLease,
    "AsyncRedlock": redlease.AsyncRedlockLease,
    "Semaphore": redlease.Lease,
    "AsyncSemaphore": redlease.AsyncLease,
}
_LOCK = [
    "client",
    "name",
    "ttl",
    "fair",
    "auto_renew",
    "on_lost",
    "max_hold",
    "reentrant",
    "prefix",
    "clock",
    "replicas",
    "replica_timeout",
]
_REDLOCK = [
    "nodes",
    "name",
    "ttl",
    "auto_renew",
    "on_lost",
    "max_hold",
    "reentrant",
    "node_timeout",
    "prefix",
    "clock",
]
_SEMAPHORE = [
    "client",
    "name",
    "limit",
    "ttl",
    "auto_renew",
    "on_lost",
    "max_hold",
    "prefix",
    "clock",
    "replicas",
    "replica_timeout",
]
CONSTRUCTOR_ARGS = {
    "Lock": _LOCK,
    "AsyncLock": [*_LOCK, "cancel_on_lost"],
    "Redlock": _REDLOCK,
    "AsyncRedlock": [*_REDLOCK, "cancel_on_lost"],
    "Semaphore": _SEMAPHORE,
    "AsyncSemaphore": [*_SEMAPHORE, "cancel_on_lost"],
}
# The methods' arguments: acquire's timeout, extend's ttl (named "ttl" in its refusals).
METHOD_ARGS = {"timeout": "timeout", "extend_ttl": "ttl"}
FRONT_SURFACE = {"acquire", "try_acquire", "name", "ttl"}
# One server's state can be read (INSPECT); a Redlock's is a vote across nodes: not offered.
LOCK_SURFACE = {*FRONT_SURFACE, "locked", "owned", "waiting"}
REDLOCK_SURFACE = {*FRONT_SURFACE, "quorum", "node_timeout"}
SEMAPHORE_SURFACE = {*LOCK_SURFACE, "limit"}
ASYNC_SURFACE = {"using"}  # asyncio only: a task can be cancelled, a thread cannot
LEASE_SURFACE = {
    "check",
    "extend",
    "fence",
    "hold_count",
    "lost",
    "lost_reason",
    "name",
    "release",
    "released",
    "remaining",
    "token",
    "valid_until",
}


# -- values -----------------------------------------------------------------------------


class Ref:
    """A client, or a list of clients, of the test's: drawn by label, made per case."""

    def __init__(self, label: str) -> None:
        self.label = label

    def __repr__(self) -> str:
        return f"Ref({self.label!r})"


def _show(value: object) -> str:
    """``repr``, short, and safe for ints too long to print (they raise ValueError)."""
    try:
        text = repr(value)
    except ValueError:
        bits = value.bit_length() if isinstance(value, int) else 0
        return f"<int of {bits} bits>"
    return text if len(text) <= 120 else f"{text[:60]}...<{len(text)} chars>"


class Case:
    """One argument fuzzed, its value, and the other arguments it needs to mean something.
    A plain class: its repr must survive values that ``repr`` cannot print."""

    def __init__(self, arg: str, value: object, context: dict[str, object]) -> None:
        self.arg, self.value, self.context = arg, value, context

    def __repr__(self) -> str:
        return f"Case({self.arg!r}, {_show(self.value)}, {self.context!r})"


# Edges and oddities no uniform draw finds: ints beyond a float (10**400) or beyond str()
# (10**5000 has more than the 4,300 digits Python prints), WAIT's and struct's limits,
# lone surrogates, hash-tag braces, RESP framing, a long name. Drawn by index, so that no
# strategy's repr has to print them.
_SPECIAL: list[object] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**53 + 1,
    2**62,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63),
    10**19,
    10**400,
    -(10**400),
    10**5000,
    -(10**5000),
    0.0,
    -0.0,
    5e-324,
    1e-300,
    0.0025,
    1e19,
    1e300,
    1e306,
    1.7976931348623157e308,
    -1e300,
    math.inf,
    -math.inf,
    math.nan,
    timedelta(0),
    timedelta(microseconds=1),
    timedelta(days=-1),
    timedelta.max,
    timedelta.min,
    Decimal("1.5"),
    Fraction(1, 3),
    complex(1, 0),
    "",
    " ",
    "1.5",
    "\ud800",
    "a\udfffb",
    "{",
    "}",
    "{x}",
    "}{",
    ":",
    "a:b:",
    "\x00",
    "\r\n*1\r\n",
    "caf\u00e9",
    "\U0001f512",
    "x" * 100_000,
    b"",
    b"x",
    bytearray(b"x"),
    [],
    [1.0],
    (),
    {},
    {"a": 1},
    object(),
    print,
]
SPECIAL: st.SearchStrategy[object] = st.sampled_from(range(len(_SPECIAL))).map(_SPECIAL.__getitem__)
TEXT = st.text(st.characters(exclude_categories=()), max_size=20)  # surrogates included
NASTY: st.SearchStrategy[object] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.timedeltas(),
    TEXT,
    st.binary(max_size=4),
    st.lists(st.floats(), max_size=2),
    st.builds(object),
)


def _seconds(low: float, high: float) -> st.SearchStrategy[object]:
    """Durations from ``low`` to ``high`` as floats, ints and timedeltas."""
    return st.one_of(
        st.floats(low, high),
        st.integers(math.floor(low), math.ceil(high)),
        st.timedeltas(timedelta(seconds=max(low, -1e9)), timedelta(seconds=min(high, 1e9))),
    )


def _on_lost(lease: object) -> None:
    pass


def _frozen() -> float:
    return 0.0


# What each argument is drawn from besides NASTY: its range, straddling the edges.
NEAR: dict[str, st.SearchStrategy[object]] = {
    "ttl": _seconds(-0.01, 2e9),
    "extend_ttl": st.one_of(st.none(), _seconds(-0.01, 2e9)),
    "timeout": st.one_of(st.none(), _seconds(-1.0, 1e300)),
    "max_hold": st.one_of(st.none(), _seconds(-1.0, 1e300)),
    "node_timeout": st.one_of(st.none(), _seconds(-1.0, 1e300)),
    "replica_timeout": st.one_of(st.none(), _seconds(-1.0, 2 * BASE_TTL), st.floats(0, 0.1)),
    "limit": st.one_of(st.integers(-2, 5), st.integers(99_990, 100_010)),
    "replicas": st.integers(-1, 3),
    "fair": st.booleans(),
    "auto_renew": st.booleans(),
    "reentrant": st.booleans(),
    "cancel_on_lost": st.booleans(),
    "on_lost": st.sampled_from([None, _on_lost, int]),
    "clock": st.sampled_from([None, time.monotonic, time.perf_counter, FakeClock(), _frozen]),
    "name": TEXT,
    "prefix": TEXT,
}
# The other arguments an argument is fuzzed with, so that its rules are all reached.
CONTEXT: dict[str, st.SearchStrategy[dict[str, object]]] = {
    "auto_renew": st.fixed_dictionaries({"max_hold": st.sampled_from([None, 30.0])}),
    "max_hold": st.fixed_dictionaries({"auto_renew": st.booleans()}),
    "clock": st.fixed_dictionaries({"auto_renew": st.booleans()}),
    "replica_timeout": st.fixed_dictionaries({"replicas": st.sampled_from([0, 1])}),
}
CLIENT_LABELS = ["client", "other", "pipeline", "class", "sentinel", "pool", "list"]
CLIENT_LABELS += ["coredis", "glide"]
NODE_LABELS = ["three", "five", "two", "one", "tuple", "pipelines", "same", "twins", "mixed"]
NODE_LABELS += ["other", "empty", "single", "generator", "with_none", "with_object"]
NODE_LABELS += ["with_class", "coredis", "glide"]


@st.composite
def cases(draw: st.DrawFn, kind: str) -> Case:
    # drawn here rather than built with builds() or map(): Hypothesis would print their
    # arguments itself, and some values (10**5000) cannot be printed
    arg = draw(st.sampled_from([*CONSTRUCTOR_ARGS[kind], *METHOD_ARGS]))
    near: st.SearchStrategy[object]
    if arg in ("client", "nodes"):
        near = st.sampled_from(NODE_LABELS if arg == "nodes" else CLIENT_LABELS).map(Ref)
    else:
        near = NEAR[arg]
    # its range 40%, the edges and oddities 30% (a few in 70 draws of an arg would rarely
    # meet a given one otherwise), anything else 30%
    pick = draw(st.integers(0, 9))
    value = draw(near if pick < 4 else SPECIAL if pick < 7 else NASTY)
    return Case(arg, value, draw(CONTEXT.get(arg, st.just({}))))


# Cases that once raised something else, run first every time (where the lock has the
# argument): the first five before this file existed, the others found by it.
REGRESSIONS = [
    Case("replica_timeout", 1e300, {"replicas": 1}),  # struct.error at acquire
    Case("name", "job\udc80", {}),  # UnicodeEncodeError at acquire
    Case("prefix", "\ud800locks:", {}),
    Case("clock", FakeClock(), {"auto_renew": True}),  # Redlock: LockLost at release
    Case("ttl", 10**400, {}),  # OverflowError: a float cannot hold it
    Case("timeout", -(10**400), {}),
    Case("ttl", 1e306, {}),  # OverflowError: ceil(inf) once in milliseconds
    Case("extend_ttl", 1e306, {}),
    Case("replicas", 2**64, {}),  # BackendError: WAIT refuses it, at acquire
    Case("node_timeout", 1e10, {}),  # OverflowError: settimeout(), if it has to connect
    Case("node_timeout", 1e19, {}),  # struct.error: SO_RCVTIMEO, if a read has to block
    Case("client", Ref("class"), {}),  # AttributeError at acquire
    Case("client", Ref("sentinel"), {}),  # a Sentinel, not its master_for(): the same
    Case("nodes", Ref("with_class"), {}),
    Case("clock", print, {"auto_renew": False}),  # TypeError at acquire (None + float)
]


# -- the test's clients and keys --------------------------------------------------------


class Env:
    """One test's clients (what a ``Ref`` names), its event loop (the asyncio cases run
    in it, one after another) and an admin client per database, to look at the keys."""

    def __init__(self, family: ClientFamily, port: int) -> None:
        self.family, self.port = family, port
        self.admins = [family.client(port=port, db=db) for db in (0, *NODE_DBS)]
        self.loop = asyncio.new_event_loop()
        self.sync = [family.client(port=port, db=db) for db in (0, *NODE_DBS)]
        self.asyncio = [family.aclient(port=port, db=db) for db in (0, *NODE_DBS)]
        coredis = importlib.import_module("coredis")
        self.coredis = [coredis.Redis(port=port, db=db) for db in (0, *NODE_DBS)]
        # a second client of a node's: a distinct object, the same node
        self.twins = [family.client(port=port, db=1), family.aclient(port=port, db=1)]
        # Sentinel itself, where the client is its master_for()
        self.sentinels = [family.sentinel(port), family.asentinel(port)]
        glide: Any = importlib.import_module("glide_sync")
        config = glide.GlideClientConfiguration([glide.NodeAddress("127.0.0.1", port)])
        self.glide = glide.GlideClient.create(config)

    @staticmethod
    def tag() -> str:
        """A mark no other case's keys carry ("fuzz1-" is not in "fuzz11-"). Unique in the
        session, so that no case meets what an earlier test left."""
        return f"fuzz{next(_TAGS)}-"

    def client(self, label: str, want_async: bool) -> Any:
        """A lock's client by label: the one it takes ("client"), or not."""
        own, other = (self.asyncio, self.sync) if want_async else (self.sync, self.asyncio)
        sub = self.family.asyncio if want_async else self.family.sync
        made: dict[str, Callable[[], Any]] = {
            "client": lambda: own[0],
            "other": lambda: other[0],
            "pipeline": lambda: own[0].pipeline(),
            "class": lambda: getattr(sub, self.family.client_type),
            "sentinel": lambda: self.sentinels[want_async],
            "pool": lambda: own[0].connection_pool,
            "list": lambda: [own[0]],
            "coredis": lambda: self.coredis[0],
            "glide": lambda: self.glide,
        }
        return made[label]()

    def nodes(self, label: str, want_async: bool) -> Any:
        """A Redlock's nodes by label: three distinct ones ("three"), or not."""
        own, other = (self.asyncio, self.sync) if want_async else (self.sync, self.asyncio)
        sub = self.family.asyncio if want_async else self.family.sync
        one, two, three = own[1:4]
        made: dict[str, Callable[[], Any]] = {
            "three": lambda: [one, two, three],
            "five": lambda: own[1:6],
            "two": lambda: [one, two],
            "one": lambda: [one],
            "tuple": lambda: (one, two, three),
            "pipelines": lambda: [one.pipeline(), two.pipeline(), three.pipeline()],
            "same": lambda: [one, one, two],
            "twins": lambda: [one, self.twins[want_async], two],
            "mixed": lambda: [one, two, other[3]],
            "other": lambda: other[1:4],
            "empty": list,
            "single": lambda: one,
            "generator": lambda: (node for node in [one, two, three]),
            "with_none": lambda: [one, two, None],
            "with_object": lambda: [one, two, object()],
            "with_class": lambda: [one, two, getattr(sub, self.family.client_type)],
            "coredis": lambda: self.coredis[1:4],
            "glide": lambda: [one, two, self.glide],
        }
        return made[label]()

    def keys(self, tag: str) -> set[tuple[int, bytes]]:
        """The keys of one case, in every database: each carries its tag."""
        return {(db, key) for db, admin in enumerate(self.admins) for key in admin.keys(f"*{tag}*")}

    def check_ttls(self, tag: str = "fuzz[0-9]*-") -> None:
        """Every key of one case (or of every case) has a TTL, fence counters included."""
        for admin in self.admins:
            for key in admin.keys(f"*{tag}*"):
                assert admin.pttl(key) != -1, f"{_show(key)} has no TTL"

    def close(self) -> None:
        async def shut() -> None:
            for client in [*self.asyncio, self.twins[1]]:
                await client.aclose()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # as asyncio.run does
            await asyncio.get_running_loop().shutdown_asyncgens()

        self.loop.run_until_complete(shut())
        self.loop.close()
        for client in [*self.sync, *self.admins, self.twins[0]]:
            client.close()
        self.glide.close()


@pytest.fixture
def env(server: servers.ServerProcess, family: ClientFamily) -> Iterator[Env]:
    made = Env(family, server.port)
    try:
        yield made
    finally:
        made.close()


# -- calls ------------------------------------------------------------------------------

REFUSED: Any = object()  # what ``outcome`` gives for a call refused with InvalidArgument


async def outcome(call: Callable[[], Any], arg: str | None, *allowed: type[BaseException]) -> Any:
    """What ``call`` gives, awaited if need be: its result; REFUSED for InvalidArgument,
    which must name ``arg``, the argument fuzzed (None: nothing was, nothing may be
    refused); or an exception of ``allowed``. Anything else fails the case."""
    expected: tuple[type[BaseException], ...] = (InvalidArgument, *allowed)
    try:
        result = call()
        if inspect.isawaitable(result):
            result = await result
    except expected as exc:
        caught = exc
    else:
        return result
    if isinstance(caught, InvalidArgument):
        assert arg is not None, f"a valid call was refused: {caught}"
        assert re.search(rf"\b{arg}\b", str(caught)), f"{arg} not named in: {caught}"
        return REFUSED
    failures = caught.failures if isinstance(caught, QuorumError) else {}
    # nodes that answered late, never a failure of another kind
    assert all("did not answer in time" in why for why in failures.values()), caught
    return caught


async def enter(block: Any) -> Any:
    """``with block`` / ``async with block``, entered."""
    if hasattr(block, "__aenter__"):
        return await block.__aenter__()
    return block.__enter__()


async def leave(block: Any) -> None:
    if hasattr(block, "__aexit__"):
        await block.__aexit__(None, None, None)
    else:
        block.__exit__(None, None, None)


def seconds(value: object) -> float:
    """An accepted duration, in seconds."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    assert isinstance(value, (int, float))
    return float(value)


class Later:
    """``call`` after ``delay``, beside the case: in a task (asyncio) or a thread."""

    def __init__(self, delay: float, call: Callable[[], Any], in_loop: bool) -> None:
        self.failure: BaseException | None = None
        self.task: asyncio.Task[Any] | None = None
        if in_loop:
            self.task = asyncio.ensure_future(self._after(delay, call))
        else:
            self.thread = threading.Thread(target=self._run, args=(delay, call), daemon=True)
            self.thread.start()

    @staticmethod
    async def _after(delay: float, call: Callable[[], Any]) -> None:
        await asyncio.sleep(delay)
        await call()

    def _run(self, delay: float, call: Callable[[], Any]) -> None:
        time.sleep(delay)
        try:
            call()
        except BaseException as exc:
            self.failure = exc

    async def join(self) -> None:
        if self.task is not None:
            await self.task
            return
        self.thread.join(HUNG)
        assert not self.thread.is_alive(), "a release hung"
        if self.failure is not None:
            raise self.failure


class Limits:
    """What a lock's settings allow its calls besides working: a grant too late to be
    valid (a tiny ttl), a lease run out (a short one), no replica acknowledging a grant
    (``replicas=`` on a server without replicas), nodes missing a tiny ``node_timeout``;
    and, for Redlock, a round whose replies came too late (a busy machine)."""

    def __init__(self, lock: Any, replicas: object, replica_timeout: object) -> None:
        self.quorum = hasattr(lock, "quorum")
        self.late = lock.ttl < MAY_BE_LATE
        self.short = lock.ttl < MAY_LOSE
        self.replicas = isinstance(replicas, int) and replicas > 0
        # how long a try waits for them (the default: a tenth of the ttl)
        given = replica_timeout is not None
        self.replica_wait = seconds(replica_timeout) if given else lock.ttl / 10
        self.slow = getattr(lock, "node_timeout", 1.0) < SLOW_NODES

    @property
    def acquiring(self) -> tuple[type[BaseException], ...]:
        allowed: list[type[BaseException]] = []
        if self.late or self.slow or self.replicas:
            allowed.append(AcquireTimeout)
        if self.replicas:
            allowed.append(BackendError)
        if self.quorum:
            allowed.append(QuorumError)
        return tuple(allowed)

    @property
    def holding(self) -> tuple[type[BaseException], ...]:
        allowed: list[type[BaseException]] = [LockLost] if self.short else []
        return (*allowed, QuorumError) if self.quorum else tuple(allowed)

    def granted(self, result: Any, kind: str) -> Any:
        """The lease ``result`` is, or None: each other outcome must be one allowed."""
        if result is None:
            assert self.late or self.slow, "try_acquire of a free lock gave None"
        elif isinstance(result, BaseException):
            if isinstance(result, BackendError) and not isinstance(result, QuorumError):
                # the one failure of a healthy server: no replica acknowledged the grant
                assert "acknowledged" in str(result), result
            return None
        else:
            assert isinstance(result, LEASES[kind]), result
        return result


# -- a case -----------------------------------------------------------------------------


async def run_case(env: Env, kind: str, case: Case) -> str:
    """One case; what became of it, for the statistics."""
    tag = env.tag()
    want_async = kind.startswith("Async")
    fuzzed = case.arg if case.arg in CONSTRUCTOR_ARGS[kind] else None
    value = case.value
    if isinstance(value, Ref):
        value = (env.nodes if kind.endswith("Redlock") else env.client)(value.label, want_async)
    if kind.endswith("Redlock"):
        slot, target = "nodes", env.nodes("three", want_async)
    else:
        slot, target = "client", env.client("client", want_async)
    kwargs: dict[str, object] = {"ttl": BASE_TTL, **case.context}
    if kind.endswith("Semaphore"):
        kwargs["limit"] = 1  # exclusive unless fuzzed: a holder makes the others wait
    name: object = tag
    if fuzzed == slot:
        target = value
    elif fuzzed == "name":
        name, kwargs["prefix"] = value, tag  # the prefix carries the tag
    elif fuzzed is not None:
        kwargs[fuzzed] = value

    def make() -> Any:
        return CLASSES[kind](target, name, **kwargs)

    lock = await outcome(make, fuzzed)
    if lock is REFUSED:
        assert env.keys(tag) == set(), "a refused constructor wrote keys"
        return "refused by the constructor"
    assert lock.name == name
    assert 0.003 <= lock.ttl <= 10**9
    assert repr(lock)
    if kind.endswith("Redlock"):
        assert lock.quorum >= 1
        assert lock.node_timeout > 0
    limits = Limits(lock, kwargs.get("replicas"), kwargs.get("replica_timeout"))
    fences: list[int] = []

    # 1. try_acquire, then every method of the lease; extend's ttl may be the one fuzzed.
    # With replicas=, its one try waits for them the whole replica_timeout: not tried when
    # that is long, unless it is not shorter than the ttl (refused, as it once raised).
    if not limits.replicas or not SHORT_WAIT < limits.replica_wait < lock.ttl:
        lease = limits.granted(await outcome(lock.try_acquire, None, *limits.acquiring), kind)
        if lease is not None and await use(env, tag, lease, lock, case, limits, fences):
            return "refused by extend"

    # 2. acquire, its timeout maybe the one fuzzed; the lease used as a context manager
    timeout = case.value if case.arg == "timeout" else SHORT_WAIT
    before = env.keys(tag)
    arg = METHOD_ARGS["timeout"] if case.arg == "timeout" else None
    got = await outcome(lambda: lock.acquire(timeout=timeout), arg, *limits.acquiring)
    if got is REFUSED:
        assert env.keys(tag) <= before, "a refused acquire wrote keys"
        env.check_ttls(tag)
        return "refused by acquire"
    lease = limits.granted(got, kind)
    if lease is not None:
        assert lease.fence > max(fences, default=0)
        fences.append(lease.fence)
        inner = await outcome(lambda: enter(lease), None)
        assert inner is lease
        await outcome(lambda: leave(lease), None, *limits.holding)
        assert lease.released or lease.lost

    # 3. with lock: it waits without a bound, so only where nothing can make it wait
    if not (limits.late or limits.slow or limits.replicas):
        lease = await outcome(lambda: enter(lock), None)
        assert isinstance(lease, LEASES[kind])
        assert lease.fence > max(fences, default=0)
        fences.append(lease.fence)
        await outcome(lambda: leave(lock), None, *limits.holding)

    # 4. the fuzzed timeout waits for a holder that lets go
    if case.arg == "timeout":
        await wait_for_holder(lock, make(), case.value, want_async, kind)
    env.check_ttls(tag)
    return "held" if fences else "never held"


async def use(
    env: Env, tag: str, lease: Any, lock: Any, case: Case, limits: Limits, fences: list[int]
) -> bool:
    """Every method and property of a held lease, then release (twice); whether extend
    refused the ttl fuzzed."""
    assert lease.name == lock.name
    assert lease.fence > max(fences, default=0)
    fences.append(lease.fence)
    assert isinstance(lease.token, str)
    assert lease.token
    assert isinstance(lease.valid_until, float)
    assert 0.0 <= lease.remaining() <= lock.ttl
    assert not lease.released
    assert repr(lease)
    short = limits.short
    await outcome(lease.check, None, *limits.holding)
    extended = None
    if case.arg == "extend_ttl":
        before = env.keys(tag)
        arg = METHOD_ARGS["extend_ttl"]
        extended = await outcome(lambda: lease.extend(case.value), arg, *limits.holding)
        if extended is REFUSED:
            assert env.keys(tag) <= before, "a refused extend wrote keys"
            assert short or not lease.lost, "a refused extend lost the lease"
        elif case.value is not None and not isinstance(extended, BaseException):
            short = short or seconds(case.value) < MAY_LOSE
    else:
        await outcome(lease.extend, None, *limits.holding)
    allowed = (*limits.holding, LockLost) if short else limits.holding
    assert isinstance(lease.lost, bool)
    assert (lease.lost_reason is not None) == lease.lost  # a reason exactly when lost
    await outcome(lease.release, None, *allowed)
    assert lease.released or lease.lost
    await outcome(lease.release, None, *allowed)  # a second release is a no-op
    assert lease.remaining() == 0.0
    assert isinstance(await outcome(lease.check, None, LockLost), LockLost)
    return extended is REFUSED


async def wait_for_holder(
    lock: Any, waiter: Any, timeout: object, want_async: bool, kind: str
) -> None:
    """``waiter.acquire(timeout)`` while ``lock`` is held by a holder that lets go after
    HOLD_FOR: it gets the lock, or times out if its timeout was that short."""
    holder = await outcome(lambda: lock.acquire(timeout=SHORT_WAIT), None)
    assert isinstance(holder, LEASES[kind])
    assert await outcome(waiter.try_acquire, None) is None  # contention is no error
    letting_go = Later(HOLD_FOR, holder.release, want_async)
    got = await outcome(lambda: waiter.acquire(timeout=timeout), None, AcquireTimeout)
    await letting_go.join()
    if isinstance(got, AcquireTimeout):
        assert timeout is not None
        assert seconds(timeout) < MAY_LOSE, "acquire timed out although the lock came free"
    else:
        assert isinstance(got, LEASES[kind])
        assert got.fence > holder.fence
        await outcome(got.release, None)


def drive(case: Coroutine[Any, Any, str]) -> str:
    """Run a sync lock's case: its coroutine never suspends, as nothing it calls gives an
    awaitable. In a thread, so that a hung call fails the test instead of stopping it."""
    failures: list[BaseException] = []
    results: list[str] = []

    def run() -> None:
        try:
            case.send(None)
        except StopIteration as stop:
            results.append(stop.value)
            return
        except BaseException as exc:
            failures.append(exc)
            return
        failures.append(AssertionError("a sync lock's call gave an awaitable"))
        case.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HUNG)
    assert not thread.is_alive(), f"a case hung for more than {HUNG} s"
    if failures:
        raise failures[0]
    return results[0]


@pytest.mark.parametrize("kind", list(CLASSES))
def test_fuzz(env: Env, kind: str) -> None:
    @settings(
        max_examples=EXAMPLES[kind],
        deadline=None,
        database=None,  # nothing written into the working tree
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(case=cases(kind))
    def fuzz(case: Case) -> None:
        if kind.startswith("Async"):
            try:
                run = asyncio.wait_for(run_case(env, kind, case), HUNG)
                became = env.loop.run_until_complete(run)
            except asyncio.TimeoutError:
                raise AssertionError(f"a case hung for more than {HUNG} s") from None
        else:
            became = drive(run_case(env, kind, case))
        event(f"{case.arg}: {became}")  # --hypothesis-show-statistics

    for case in REGRESSIONS:
        if case.arg in (*CONSTRUCTOR_ARGS[kind], *METHOD_ARGS):
            fuzz = example(case=case)(fuzz)
    fuzz()
    env.check_ttls()  # also what the cases left to run on after them (batches, renewal)


def test_the_fuzzer_knows_every_parameter_and_method() -> None:
    """A parameter or method added later must be fuzzed too: this fails until it is."""
    for kind, cls in CLASSES.items():
        params = {p for p in inspect.signature(cls).parameters if not p.startswith("_")}
        assert params == set(CONSTRUCTOR_ARGS[kind]), kind
        public = {n for n in dir(cls) if not n.startswith("_")}
        surfaces = {"Redlock": REDLOCK_SURFACE, "Semaphore": SEMAPHORE_SURFACE}
        expected = surfaces.get(kind.removeprefix("Async"), LOCK_SURFACE)
        if kind.startswith("Async"):
            expected = expected | ASYNC_SURFACE
            using = inspect.signature(cls.using).parameters  # its timeout is acquire's
            assert list(using) == ["self", "fn", "args", "timeout"]
        assert public == expected, kind
        assert list(inspect.signature(cls.acquire).parameters) == ["self", "timeout"]
        lease = LEASES[kind]
        assert {n for n in dir(lease) if not n.startswith("_")} == LEASE_SURFACE, kind
        assert list(inspect.signature(lease.extend).parameters) == ["self", "ttl"]
