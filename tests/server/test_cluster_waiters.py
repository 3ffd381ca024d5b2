"""Many callers waiting through an application's Cluster client cost a bounded number of
its connections: redlease makes at most CLIENT_CALLS calls through such a client at once
(each takes a connection of the client's pool for its round trip), and its waiters wait
on the nodes' hubs, not on the client's connections. 300 asyncio tasks (and 300 threads)
waiting on 100 held names over 3 masters: the client's connections on each node, read
from CLIENT LIST, stay within CLIENT_CALLS plus the hub and the client's own look at the
cluster; a pool capped well below 300 is never exhausted; all finish."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest

import families
import redlease
from families import ClientFamily
from redlease._wire.endpoint import CLIENT_CALLS
from redlease.tools import servers
from waiting_helpers import lock_key, wait_until

NAMES = 100
CALLERS = 300
APP = "app-under-test"  # the application client's connection name, to count its own
# Besides redlease's calls, a node has redlease's hub (its waiters' one connection, made
# with the client's settings, its name included) and the client's own look at the slots.
OWN = 2
CAP = 32  # the application's pool per node: far below one connection per caller


def app_connections(nodes: list[servers.ServerProcess]) -> list[int]:
    counts = []
    for node in nodes:
        admin = families.client(port=node.port)
        counts.append(sum(1 for c in admin.client_list() if c.get("name") == APP))
        admin.close()
    return counts


def queued(admin: Any) -> int:
    return sum(int(admin.llen(lock_key(f"busy:{i}") + ":line")) for i in range(NAMES))


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_300_tasks_on_100_names_over_3_masters(
    cluster: list[servers.ServerProcess], family: ClientFamily
) -> None:
    admin = family.cluster(cluster[0].port)
    holders = [redlease.Lock(admin, f"busy:{i}", ttl=60.0).acquire() for i in range(NAMES)]
    app = family.acluster(cluster[0].port, client_name=APP, max_connections=CAP)
    most = [0, 0, 0]

    async def caller(i: int) -> int:
        lock = redlease.AsyncLock(app, f"busy:{i % NAMES}", ttl=60.0)
        lease = await lock.acquire(timeout=120)
        async with lease:
            return lease.fence

    tasks = [asyncio.create_task(caller(i)) for i in range(CALLERS)]
    try:
        for _ in range(600):  # until every caller is queued on the server
            await asyncio.sleep(0.1)
            most = [max(a, b) for a, b in zip(most, app_connections(cluster), strict=True)]
            if queued(admin) == CALLERS or any(task.done() for task in tasks):
                break
        assert queued(admin) == CALLERS
        for holder in holders:
            holder.release()
        fences = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        most = [max(a, b) for a, b in zip(most, app_connections(cluster), strict=True)]
    finally:
        for task in tasks:
            task.cancel()
        await app.aclose()
        admin.close()
    assert len(fences) == CALLERS
    assert max(most) <= CLIENT_CALLS + OWN, f"the client's connections per node: {most}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_300_threads_on_100_names_over_3_masters(
    cluster: list[servers.ServerProcess], family: ClientFamily
) -> None:
    admin = family.cluster(cluster[0].port)
    holders = [redlease.Lock(admin, f"busy:{i}", ttl=60.0).acquire() for i in range(NAMES)]
    app = family.cluster(cluster[0].port, client_name=APP, max_connections=CAP)
    done: list[Any] = []
    guard = threading.Lock()

    def caller(i: int) -> None:
        try:
            with redlease.Lock(app, f"busy:{i % NAMES}", ttl=60.0).acquire(timeout=120):
                result: Any = "acquired"
        except BaseException as exc:
            result = exc
        with guard:
            done.append(result)

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(CALLERS)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: queued(admin) == CALLERS, timeout=120)
        most = app_connections(cluster)
        for holder in holders:
            holder.release()
        for thread in threads:
            thread.join(120)
        most = [max(a, b) for a, b in zip(most, app_connections(cluster), strict=True)]
    finally:
        app.close()
        admin.close()
    assert done == ["acquired"] * CALLERS
    assert max(most) <= CLIENT_CALLS + OWN, f"the client's connections per node: {most}"


@pytest.mark.timeout(120)
def test_calls_hung_on_one_node_do_not_hold_up_the_others_past_their_bound(
    cluster: list[servers.ServerProcess], family: ClientFamily
) -> None:
    app = family.cluster(cluster[0].port)
    port_of = {}  # the node serving each candidate name, by port
    for i in range(200):
        port_of[f"n{i}"] = app.get_node_from_key(lock_key(f"n{i}")).port
    stuck_port = cluster[0].port
    stuck = next(n for n, p in port_of.items() if p == stuck_port)
    healthy = next(n for n, p in port_of.items() if p != stuck_port)
    cluster[0].pause()
    hung = [threading.Thread(target=_try, args=(app, stuck), daemon=True) for _ in range(12)]
    try:
        for thread in hung:
            thread.start()
        time.sleep(0.5)  # every call slot of the client is taken by a hung call now
        started = time.monotonic()
        with pytest.raises(redlease.BackendError):
            redlease.Lock(app, healthy, ttl=1.0).try_acquire()
        assert time.monotonic() - started < 10  # given up on, not held up for good
    finally:
        cluster[0].resume()
        for thread in hung:
            thread.join(30)
        app.close()


def _try(client: Any, name: str) -> None:
    with contextlib.suppress(redlease.LockError):
        lease = redlease.Lock(client, name, ttl=1.0).try_acquire()
        if lease is not None:
            lease.release()
