"""The driver: carries the core's operations to a server.

The asyncio flavour is this source; ``scripts/unasync.py`` generates the blocking one
(``_sync.io``) from it. What differs beyond ``async``/``await`` is in ``_async.backend``.

A client redlease knows (``_wire.endpoint``) is served on redlease's own connections
(``_async.conn``: a pool per server, and under asyncio per event loop); anything else
(``RedisCluster``, other client types) through the client's public methods, which route
each script to the node owning the lock's hash slot. A connection failure is tried
again as many times as the client's own retry policy says, but only where sending again
is safe (a command that never left, or a script that says why a second run is harmless:
``Script.retry``) and never past the operation's bound. ``served`` makes the driver of
every one-server lock.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from .._base.timing import CONNECT_RETRY_BASE, CONNECT_RETRY_CAP, SHORTEST_WAIT, backoff
from .._clients import NotRedis, caught
from .._clients.errors import backend_failures, is_noscript, is_unblocked, reply_errors
from .._rules import settings as _settings
from .._rules.arguments import replicas_served
from .._rules.flows import Flow, LockSpec
from .._rules.ops import LATE_WAKE, Call, Command, Listen, Op, Replicas, Sleep, Wait
from .._rules.quorum import UNREAD, Unsent, said_yes
from .._wire import resp as _resp
from .._wire import stale as _stale
from .._wire.endpoint import Route, endpoint_of, node_of, retries_of
from .._wire.errors import backend_error
from .backend import ASYNC, bounded, client_slot, meet_cluster, sleep
from .conn import Box, Connection, Pool, node_pool, pool_for

T = TypeVar("T")

# A connection whose CLIENT ID the server refused (an ACL user without +client|id): a wait
# on it that is given up on is not ended by CLIENT UNBLOCK; its reply is waited for.
NO_CLIENT_ID = -1


async def _reply(conn: Connection, op: Call | Command, timeout: float) -> Any:
    """The reply to ``op``, just written on ``conn``, within ``timeout``; a script or
    function the server lacks is sent again as ``Wire.again`` says, in the time left."""
    end = time.monotonic() + timeout
    try:
        return await conn.read(timeout)
    except reply_errors() as exc:
        if isinstance(op, Command):
            raise
        return await _sent_again(conn, op, exc, end)


async def _sent_again(conn: Connection, op: Call, error: BaseException, end: float) -> Any:
    """The reply to ``op`` sent again after its reply was ``error``, if the server lacked
    its script or function (raised otherwise). At most three sends: FCALL not found,
    the library loaded (or refused), FCALL or EVAL. Every read waits until ``end`` (the
    monotonic clock's) at most."""

    def left() -> float:
        return max(SHORTEST_WAIT, end - time.monotonic())

    for _ in range(3):
        again = conn.wire.again(op, error)
        if again is None:
            raise error
        data, loading = again
        await conn.send(data)
        if loading:
            try:
                conn.wire.loaded(await conn.read(left()))
            except reply_errors() as refused:
                conn.wire.loaded(refused)
        try:
            return await conn.read(left())
        except reply_errors() as exc:
            error = exc
    raise error


def _first(conn: Connection) -> bytes:
    """What goes before a call on ``conn``: the library's load if it is the first call
    to its server (``Wire.first``), whose reply the connection then owes as stale."""
    lead = conn.wire.first(conn.lean)
    if lead:
        conn.stale += 1
    return lead


async def _replicas_acked(conn: Connection, replicas: Replicas, timeout: float) -> int:
    """WAIT on the connection that made the write: how many replicas have it."""
    await conn.send(_resp.command(("WAIT", str(replicas.count), str(replicas.timeout_ms))))
    return int(await conn.read(replicas.timeout_ms / 1000.0 + timeout, spin=False))


class AsyncIO:
    """Runs flows against one client."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.endpoint = endpoint_of(client, asyncio=ASYNC)
        self._pools = self.endpoint.route is not Route.CLIENT
        self._pool: Pool | None = None  # found at first use (asyncio: the running loop's)
        self._look = _settings.Look(_settings.SETTINGS_WAIT)  # (see check_server_once)
        self.late: list[Any] = []  # a fan-out's call given up on (see ``bounded``)
        # A Cluster client: waiters listen through the hub of the node serving their lock
        self.cluster = self.endpoint.route is Route.CLIENT and hasattr(client, "get_node_from_key")

    @property
    def direct(self) -> bool:
        """True when commands go on redlease's own connections (not the client's methods)."""
        return self._pools

    @property
    def pool(self) -> Pool | None:
        """redlease's connections to this client's server (None: the client's methods)."""
        pool = self._pool
        if pool is None or not pool.current():
            if not self._pools:
                return None
            pool = self._pool = pool_for(self.client, self.endpoint)
        return pool

    def describe(self) -> str:
        return self.endpoint.label

    # -- running flows ---------------------------------------------------------------

    async def run(self, flow: Flow[T], action: str) -> T:
        """Drive ``flow`` to its end; server failures are thrown into it as BackendError."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                op = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            try:
                reply, error = await self.execute(op), None
            except backend_failures() as exc:
                reply, error = None, backend_error(exc, action, server=self.describe())

    async def execute(self, op: Op) -> Any:
        if isinstance(op, Call):
            return await self._call(op)
        if isinstance(op, Wait):
            return await self._wait(op)
        if isinstance(op, Listen):
            return await self._listen(op)
        if isinstance(op, Sleep):
            await sleep(op.seconds)
            return None
        return await self._command(op)

    async def check_server_once(self, within: float | None = None) -> None:
        """Warn (once per server) if the server may evict lock keys; never fails (see
        ``_rules.settings``). It looks for ``within`` at most, if given."""
        if self._look.done:  # (every acquire asks: no call once it has looked)
            return
        wait = self._look.due(within)
        if wait is None:
            return
        pool = self.pool
        if not _settings.first_look(pool, self.client):
            return
        reply: Any
        try:
            if pool is None:
                async with client_slot(self.client, wait):
                    reply = await self.client.config_get(_settings.POLICY)
            else:
                reply = await self._command(_settings.eviction_policy(wait))
        except Exception as failed:
            reply = failed
        _settings.warn_if_weak(self.describe(), reply)

    async def execute_many(self, ops: Sequence[Call]) -> list[Any]:
        """The renewer's seam: ``ops`` pipelined on one connection, one round trip for
        all. Each result is the reply, or the BackendError for that op. With replicas=,
        one op at a time: only ``execute`` follows an EXTEND with its ``WAIT`` on the
        connection that wrote it."""
        pool = self.pool
        if pool is None or any(op.replicas is not None for op in ops):
            replies: list[Any] = []
            for op in ops:
                try:
                    replies.append(await self.execute(op))
                except backend_failures() as exc:
                    replies.append(backend_error(exc, "renew", server=self.describe()))
            return replies
        results: list[Any] = []

        async def pipeline(conn: Connection, timeout: float) -> list[Any]:
            end = time.monotonic() + timeout
            results.clear()
            await conn.send(_first(conn) + b"".join(map(pool.wire, ops)))
            lost: dict[int, BaseException] = {}  # a script or function the server lacked
            for _ in ops:
                try:
                    results.append(await conn.read(timeout))
                except reply_errors() as exc:
                    if not conn.wire.lacks(exc):
                        results.append(backend_error(exc, "renew", server=self.describe()))
                        continue
                    lost[len(results)] = exc
                    results.append(None)  # (filled in below, once the pipeline is drained)
            for i, error in lost.items():
                try:
                    results[i] = await _sent_again(conn, ops[i], error, end)
                except reply_errors() as exc:
                    results[i] = backend_error(exc, "renew", server=self.describe())
            return results

        try:
            # renewals (EXTEND) are safe to send again
            return await self._on_connection(pipeline, min(op.timeout for op in ops), safe=True)
        except backend_failures() as exc:
            error = backend_error(exc, "renew", server=self.describe())
            # (None: an op whose script was lost and that was not sent again)
            done = [error if result is None else result for result in results]
            return done + [error] * (len(ops) - len(results))

    # -- operations --------------------------------------------------------------------

    async def _on_connection(
        self,
        work: Callable[[Connection, float], Awaitable[T]],
        timeout: float,
        *,
        safe: bool,
        patient: bool = True,
    ) -> T:
        """``work(conn, time_left)`` on one of redlease's connections, within ``timeout``.

        A connection failure is retried as many times as the client's retry policy says
        (``retries_of``: a client without one, such as valkey-py's or redis-py 5's
        default, once), while time is left (``_retrying``), if nothing was written yet or
        the work is ``safe`` to do twice (not after a timeout: the server may still be
        doing it). Not ``patient`` (a try): once more at once, and no more."""
        pool = self.pool
        assert pool is not None
        end = time.monotonic() + timeout
        try:
            return await self._attempt(pool, work, timeout, safe=safe, end=end)
        except _Final as final:
            raise final.error from final.error.__cause__
        except backend_failures() as first:
            retries = retries_of(pool.endpoint.retry) if patient else 1
            return await _retried(
                functools.partial(self._attempt, pool, work, safe=safe, end=end),
                first,
                retries,
                end,
            )

    async def _attempt(
        self,
        pool: Pool,
        work: Callable[[Connection, float], Awaitable[T]],
        left: float,
        *,
        safe: bool,
        end: float,
    ) -> T:
        """One try on one connection, given back clean or dropped. A failure that may
        not be tried again (see ``_again``) is raised as _Final."""
        conn: Connection | None = None
        try:
            conn = await pool.take(left)
            assert conn is not None
            result = await work(conn, min(left, pool.endpoint.read_limit))
        except reply_errors() as exc:
            if conn is not None:
                pool.give(conn)  # the reply was read in full: the connection is clean
            raise _Final(exc) from exc  # the server said no: not a failure to try again
        except BaseException as exc:
            if conn is not None:
                pool.discard(conn)  # a reply may still be on its way
            if isinstance(exc, backend_failures()) and not _again(exc, conn is not None, safe, end):
                raise _Final(exc) from exc
            raise
        pool.give(conn)
        return result

    async def _call(self, op: Call) -> Any:
        pool = self.pool
        if pool is None:
            async with client_slot(self.client, op.timeout):
                return await self._client_call(op)
        wire = pool.wire
        sent = [False]  # (sent again: with its ``again`` arguments, if it has them)

        async def call(conn: Connection, timeout: float) -> Any:
            this = op
            if sent[0] and op.again is not None:
                this = dataclasses.replace(op, args=op.again)
            sent[0] = True
            await conn.send(_first(conn) + wire(this))
            reply = await _reply(conn, this, timeout)
            if op.replicas is not None:
                reply = (reply, await _replicas_acked(conn, op.replicas, timeout))
            return reply

        # WAIT counts the writes of its own connection: a replicated op is not sent again
        safe = bool(op.script.retry) and op.replicas is None
        return await self._on_connection(call, op.timeout, safe=safe, patient=op.patient)

    async def _client_call(self, op: Call) -> Any:
        """``op`` through the client's own methods: EVALSHA, or EVAL when lost. (Not
        functions: a Cluster client routes EVALSHA by its keys as it is, but asks a node
        for an FCALL's keys first, a round trip more on every call.)"""
        client, n = self.client, len(op.keys)
        args = op.args if op.again is None else op.again  # (its retries send it as it is)
        try:
            return await client.evalsha(op.script.sha, n, *op.keys, *args)
        except reply_errors() as exc:
            if not is_noscript(exc):
                raise
            return await client.eval(op.script.source, n, *op.keys, *args)

    async def _command(self, op: Command) -> Any:
        if not self._pools:
            async with client_slot(self.client, op.timeout):
                return await self.client.execute_command(*op.args)

        async def command(conn: Connection, timeout: float) -> Any:
            await conn.send(_resp.command(op.args))
            return await conn.read(timeout)

        # (reads only: safe to send again)
        return await self._on_connection(command, op.timeout, safe=True, patient=op.patient)

    async def _listen(self, op: Listen) -> Box | None:
        pool = await self._hub_pool(op.prefix)
        hub = None if pool is None else pool.hub
        if pool is None or hub is None:
            return None
        box = op.box
        assert box is None or isinstance(box, Box)
        if box is None or box.owner is not hub:  # (a Cluster's slot moved: the new node's)
            fresh = hub.listen(op.prefix, op.token)
            if box is None or fresh is None:
                return fresh
            box = fresh
        # The hub's connection is tried again as a call's is: a waiter without a deadline
        # outlasts a restart that takes a moment (a SUBSCRIBE is safe to send twice).
        end = time.monotonic() + op.timeout
        try:
            return await hub.subscribe(box, op.timeout)
        except backend_failures() as first:
            again = functools.partial(hub.subscribe, box)
            return await _retried(again, first, retries_of(pool.endpoint.retry), end)

    async def _hub_pool(self, prefix: str) -> Pool | None:
        """The pool whose hub a waiter on the lock of bell ``prefix`` listens through:
        its server's, or on a Cluster that of the node serving the lock's slot; None:
        bells."""
        pool = self.pool
        if pool is None and self.cluster:
            node = node_of(self.client, prefix)
            if node is None:  # a client that has not met its cluster yet (idempotent)
                try:
                    await meet_cluster(self.client)
                except backend_failures():
                    return None  # unreachable for now: this wait's tries will say
                node = node_of(self.client, prefix)
            pool = None if node is None else node_pool(self.client, node)
        return pool

    async def _wait(self, op: Wait) -> Any:
        if isinstance(op.box, Box):  # rung through the hub: no connection of our own
            return await op.box.wait(op.give_up)
        # A blocked waiter occupies one of redlease's connections, never one of the
        # client's pool, so waiting cannot starve the application.
        pool = self.pool
        if pool is None:
            reply = await self.client.blpop([op.key], op.timeout)
            return None if reply is None else reply[1]
        nothing = None if op.replicas is None else (None, 0)
        conn = await pool.take(op.connect_timeout, blocking=True)
        if conn is None:  # every connection a wait may hold is busy: try again later
            return nothing
        # The reply is due when the wait ends: LATE_WAKE after that, the server counts
        # as late (the client's socket_timeout bounds replies due at once, not this one).
        wait = op.timeout
        try:
            blpop = _resp.command(("BLPOP", op.key, f"{wait:.3f}"))
            if conn.lean and conn.client_id is None:  # learnt once, in the same write
                await conn.send(_resp.command(("CLIENT", "ID")) + blpop)
                try:
                    conn.client_id = int(await conn.read(op.connect_timeout))
                except reply_errors():
                    conn.client_id = NO_CLIENT_ID  # denied (ACL): see _unblock
            else:
                await conn.send(blpop)
            try:
                reply = await conn.read(wait + LATE_WAKE, spin=False)  # a blocking command
            except caught().timeout:
                reply = await self._unblock(conn, op.connect_timeout)
        except _Owed:
            # The BLPOP's own reply is still to come (an idle server answers its timeout
            # late): it is dropped when it comes, and the connection used again then. A
            # ring dropped so is not lost: a grant stays in the lock key, where the next
            # try finds it.
            pool.owe(conn, blocking=True)
            return nothing
        except caught().connection:
            pool.discard(conn, blocking=True)  # lost while waiting: look at the lock again
            return nothing
        except reply_errors() as exc:
            pool.give(conn, blocking=True)
            if is_unblocked(exc):  # the server changed role (a failover): look again
                return nothing
            raise
        except BaseException:
            pool.discard(conn, blocking=True)
            raise
        try:
            rung = None if reply is None else reply[1]
            if op.replicas is not None:
                acked = 0 if rung is None else await _replicas_acked(conn, op.replicas, op.timeout)
                rung = (rung, acked)
        except BaseException:
            pool.discard(conn, blocking=True)
            raise
        pool.give(conn, blocking=True)
        return rung

    async def _unblock(self, conn: Connection, timeout: float) -> Any:
        """A wait given up on: the server answers a BLPOP's timeout late when idle (it
        looks every 1/hz), so it is ended now (CLIENT UNBLOCK, from another connection)
        and its reply read: nil, or a ring that came in the meantime, which counts. The
        connection is then clean. _Owed if that cannot be done (no CLIENT ID, or ACL)."""
        pool = self.pool
        if conn.client_id in (None, NO_CLIENT_ID) or pool is None:
            raise _Owed
        other = await pool.take(timeout)
        assert other is not None
        try:
            await other.send(_resp.command(("CLIENT", "UNBLOCK", str(conn.client_id))))
            await other.read(timeout)
        except reply_errors():
            pool.give(other)
            raise _Owed from None
        except BaseException:
            pool.discard(other)
            raise _Owed from None
        pool.give(other)
        try:
            return await conn.read(timeout, spin=False)
        except caught().timeout:
            raise _Owed from None


async def _retried(
    attempt: Callable[[float], Awaitable[T]], first: BaseException, retries: int, end: float
) -> T:
    """``attempt(time_left)`` again after its first try failed with ``first``, as
    ``_retrying`` spaces the tries before ``end``; the last failure is raised (and one
    carried as _Final, at once)."""
    failed = [first]  # the last failure, if a retry finds no time left

    async def once() -> T:
        left = end - time.monotonic()
        if left <= 0:
            raise _Final(failed[-1])
        try:
            return await attempt(left)
        except backend_failures() as exc:
            failed.append(exc)
            raise

    try:
        return await _retrying(once, retries, end)
    except _Final as final:
        raise final.error from final.error.__cause__


async def _retrying(once: Callable[[], Awaitable[T]], retries: int, end: float) -> T:
    """``once`` (a retry: the first try failed) up to ``retries`` times while it fails:
    the first at once, then the others spread over the time left before ``end``, the
    operation's bound: each after an equal share of it, but at most CONNECT_RETRY_CAP
    apart and at least redlease's own back-off, so that a server restarting for a moment
    is waited out; none is begun that would not start before ``end``. (The client's
    retry policy gives the count; its back-off is not public, and redis-py's default
    sleeps for seconds, past any bound.)"""
    failures = 0
    while True:
        try:
            return await once()
        except backend_failures():
            failures += 1
            if failures >= retries:
                raise
            left = end - time.monotonic()
            share = left / (retries - failures + 1)
            delay = max(
                min(share, CONNECT_RETRY_CAP),
                backoff(failures, CONNECT_RETRY_BASE, CONNECT_RETRY_CAP),
            )
            if delay >= left:
                raise
            await sleep(delay)


class _Owed(Exception):
    """A wait's reply is still to come on its connection."""


class _Final(Exception):
    """Carries an error past the client's retry policy: not to be retried."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _again(error: BaseException, written: bool, safe: bool, end: float) -> bool:
    """Whether a failed try may be made again: time is left, and nothing was written or
    the work is safe to do twice (not after a timeout: the server may still be at it)."""
    if time.monotonic() >= end or isinstance(error, NotRedis):
        return False
    return not written or (safe and not isinstance(error, caught().timeout))


async def fan_out(
    ios: Sequence[AsyncIO],
    op: Call | Command,
    nodes: Sequence[int],
    timeout: float,
    action: str,
    enough: int = 0,
    yes: Callable[[Any], bool] = said_yes,
) -> list[Any]:
    """``op`` on each of ``nodes`` at once: written to every node's connection, then the
    replies read in turn (no thread per node). Each reply is due ``timeout`` after its
    own node's send began: a node that needs a new connection to a hung server (whose
    handshake waits out the timeout) must not use up the others' time.

    One result per node, in order: the reply, or the BackendError that stands for none
    (an ``Unsent`` one when the command never left). A node that did not answer in time
    loses its connection, so a late reply cannot be mistaken for a later command's.
    Once ``enough`` replies satisfy ``yes`` (see ``_rules.quorum.Fanout``), the replies still
    due on socket connections are left to their next read, and their results are UNREAD.
    Nothing is sent twice here: a node that failed is a "no" for this round. A node
    reached through its client's own methods is called under ``bounded``, also given up on
    after ``timeout``."""
    clock = time.monotonic
    packed: dict[int, bytes] = {}  # the op's bytes, packed once for all nodes
    results: list[Any] = [None] * len(nodes)
    sent: list[tuple[int, Connection, Pool, float]] = []  # (result index, conn, pool, due)
    try:
        for at, i in enumerate(nodes):
            io = ios[i]
            pool = io.pool
            due = clock() + timeout
            if pool is None:  # the client's own call, one node at a time
                try:
                    results[at] = await bounded(functools.partial(io.execute, op), timeout, io.late)
                except backend_failures() as exc:
                    results[at] = backend_error(exc, action)
                continue
            try:
                conn = await pool.take(timeout)
                assert conn is not None
            except backend_failures() as exc:
                results[at] = backend_error(exc, action, Unsent)
                continue
            try:
                await conn.send(_first(conn) + pool.wire(op, packed))
            except BaseException as exc:
                pool.discard(conn)  # part of the command may have left
                if not isinstance(exc, backend_failures()):
                    raise
                results[at] = backend_error(exc, action)
                continue
            sent.append((at, conn, pool, due))
        for entry in list(sent):
            # while the replies are on their way: drop what earlier fan-outs left unread
            at, conn, pool, _ = entry
            failure = conn.drop_arrived() if conn.stale else None
            if failure is not None:
                sent.remove(entry)
                pool.discard(conn)
                results[at] = backend_error(failure, action)
        confirmed = 0
        while sent:
            at, conn, pool, due = sent[0]
            wait = due - clock()
            try:
                results[at] = await _reply(
                    conn, op, wait if wait > SHORTEST_WAIT else SHORTEST_WAIT
                )
            except reply_errors() as exc:
                results[at] = backend_error(exc, action)
            except backend_failures() as exc:
                del sent[0]
                pool.discard(conn)
                results[at] = backend_error(exc, action)
                continue
            del sent[0]
            pool.give(conn)  # the reply was read in full: the connection is clean
            if enough and yes(results[at]):
                confirmed += 1
                if confirmed >= enough:
                    _leave_unread(sent, results)
                    enough = 0
    finally:
        for _, other, owner, _ in sent:  # interrupted, or a bug: replies still on their way
            owner.discard(other)
    return results


def _leave_unread(sent: list[tuple[int, Connection, Pool, float]], results: list[Any]) -> None:
    """Give back the connections whose replies are still due and may be owed (socket
    ones that owe fewer than MAX_STALE), each reply now stale; the rest stay to be read."""
    for entry in list(sent):
        at, conn, pool, _ = entry
        if conn.lean and conn.stale < _stale.MAX_STALE:
            conn.stale += 1
            sent.remove(entry)
            pool.give(conn)
            results[at] = UNREAD


def served(client: Any, spec: LockSpec) -> AsyncIO:
    """The driver of a one-server lock over ``client`` (``replicas=`` checked against it)."""
    io = AsyncIO(client)
    replicas_served(spec.replicas, io.direct)
    return io
