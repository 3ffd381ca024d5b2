"""Every CLI failure names what happened and where, in one line (issue 32, item 1): a
server out of reach says so; a server that was reached and refused (a wrong or missing
password, a database it does not have, a key of another type under the prefix) says
what it refused, never "cannot reach". Each subcommand goes the same way, through a
subprocess against a real server; none prints a traceback."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from cli_helpers import finish, start
from redlease.tools import servers

COMMANDS = (
    ("list",),
    ("inspect", "wh"),
    ("release", "wh", "--force", "--yes"),
    ("run", "wh", "-n"),
)


@pytest.fixture
def guarded(binary: servers.ServerBinary) -> Iterator[int]:
    """A server with a password ("pw"), and a hash where the lock 'wh' would be."""
    with servers.ServerProcess(binary) as proc:
        client = redis.Redis(port=proc.port)
        client.hset("redlease:{wh}", "field", "value")
        client.pexpire("redlease:{wh}", 60_000)
        client.config_set("requirepass", "pw")
        client.close()
        yield proc.port


def _one_line(argv: tuple[str, ...], url: str) -> str:
    extra = ["--", "true"] if argv[0] == "run" else []
    code, out, err = finish(start([*argv, "--redis", url, *extra]))
    assert code == 2, (argv, out, err)
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("redlease:")]
    return line


@pytest.mark.parametrize(
    ("url", "meaning"),
    [
        ("redis://:wrong@127.0.0.1:{port}", "authentication failed: wrong username or password"),
        ("redis://127.0.0.1:{port}", "authentication required"),
        ("redis://:pw@127.0.0.1:{port}/99", "no database of that number"),
        ("redis://:pw@127.0.0.1:{port}", "holds a"),  # (a hash; a value of another type)
    ],
    ids=["wrong-password", "no-password", "no-such-database", "wrong-type"],
)
def test_a_refusal_says_what_was_refused(guarded: int, url: str, meaning: str) -> None:
    for argv in COMMANDS:
        if meaning.startswith("holds") and argv[0] == "list":
            continue  # (list skips keys that are not a lock's: nothing to refuse)
        line = _one_line(argv, url.format(port=guarded))
        assert meaning in line, (argv, line)
        assert "cannot reach" not in line, (argv, line)
        assert f"127.0.0.1:{guarded}" in line, (argv, line)


def test_a_server_out_of_reach_says_so_and_where() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nobody listens there
    for argv in COMMANDS:
        line = _one_line(argv, f"redis://127.0.0.1:{port}")
        assert line.startswith("redlease: cannot reach the server"), (argv, line)
        assert f"127.0.0.1:{port}" in line, (argv, line)


def test_run_json_says_a_failure_as_json(guarded: int) -> None:
    """``run --json`` (a job run by cron, whose log is read by a program) says why it
    failed as one of its JSON events, with the exit code: a server out of reach, and a
    server that refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nobody = probe.getsockname()[1]
    for url, meaning in (
        (f"redis://127.0.0.1:{nobody}", "cannot reach the server"),
        (f"redis://:wrong@127.0.0.1:{guarded}", "authentication failed"),
    ):
        code, out, err = finish(start(["run", "wh", "-n", "--json", "--redis", url, "--", "true"]))
        assert code == 2, (url, out, err)
        (line,) = err.splitlines()
        event = json.loads(line)
        assert (event["event"], event["name"], event["code"]) == ("error", "wh", 2), event
        assert meaning in event["message"], event


def test_an_acl_user_without_a_command_is_told_which_to_add(
    binary: servers.ServerBinary,
) -> None:
    """A user the ACL lets read and write but not run scripts (or SCAN): each command says
    which command to add to its rule, and where the whole rule is."""
    with servers.ServerProcess(binary) as proc:
        admin: Any = redis.Redis(port=proc.port)
        admin.execute_command(
            "ACL",
            "SETUSER",
            "limited",
            "reset",
            "on",
            ">pw",
            "~*",
            "+get",
            "+set",
            "+hello",
            "+client",
            "+ping",
            "+config|get",
        )
        admin.close()
        url = f"redis://limited:pw@127.0.0.1:{proc.port}"
        for argv, command in [*((a, "EVAL") for a in COMMANDS[1:]), (COMMANDS[0], "SCAN")]:
            line = _one_line(argv, url)
            assert f"may not run {command}: add +{command.lower()} to its rule" in line, line
            assert "least-privilege" in line, line
            assert f"127.0.0.1:{proc.port}" in line, line
        line = _one_line(("run", "job", "--ttl", "1m", "--every", "1h"), url)
        assert "may not run EVAL" in line, line  # (a scheduled job's try, the same way)


def test_a_read_only_replica_says_to_point_at_the_master(
    master_and_replica: tuple[servers.ServerProcess, servers.ServerProcess],
) -> None:
    master, replica = master_and_replica
    client = redis.Redis(port=master.port)
    client.set("redlease:{held}", "someone", px=60_000)  # a lock held, seen on the replica
    assert client.wait(1, 10_000) == 1
    client.close()
    url = f"redis://127.0.0.1:{replica.port}"
    for argv in (("run", "job", "-n"), ("release", "held", "--force", "--yes")):
        line = _one_line(argv, url)
        assert "the server is a read-only replica: point redlease at the master" in line, line
        assert f"127.0.0.1:{replica.port}" in line, line
    # reading works there: inspect says who holds it (exit 0)
    code, out, err = finish(start(["inspect", "held", "--redis", url]))
    assert code == 0, err
    assert "held" in out


class _NotRedis:
    """A listener that answers whatever it is sent as an HTTP server would."""

    def __init__(self) -> None:
        import threading

        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = int(self.listener.getsockname()[1])
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):  # (a client may reset it)
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


@pytest.fixture
def not_redis() -> Iterator[_NotRedis]:
    server = _NotRedis()
    yield server
    server.listener.close()


def test_a_port_that_is_not_redis_says_so(not_redis: _NotRedis) -> None:
    for argv in COMMANDS:
        line = _one_line(argv, f"redis://127.0.0.1:{not_redis.port}")
        assert "does not speak Redis" in line, (argv, line)
        assert "cannot reach" not in line, (argv, line)
        assert f"127.0.0.1:{not_redis.port}" in line, (argv, line)
