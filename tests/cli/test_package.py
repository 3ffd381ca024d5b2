"""The package as published: one version source, a public API without test-only
switches (arguments or names that only the test suite or the fault harness should use),
and an import that pays for no client library."""

from __future__ import annotations

import importlib.metadata
import inspect
import subprocess
import sys

import redlease


def test_one_version_source() -> None:
    assert redlease.__version__ == importlib.metadata.version("redlease")


def test_no_test_only_switches_in_the_public_api() -> None:
    for name in redlease.__all__:
        assert not name.startswith("_") or name == "__version__", name
        obj = getattr(redlease, name)
        if not inspect.isclass(obj):
            continue
        for attr, member in inspect.getmembers(obj):
            if attr.startswith("_") and attr != "__init__":
                continue
            if not callable(member):
                continue
            try:
                signature = inspect.signature(member)
            except (TypeError, ValueError):
                continue
            private = [p for p in signature.parameters if p.startswith("_")]
            assert not private, f"{name}.{attr} takes {private}"


def test_import_loads_no_client_library() -> None:
    """``import redlease`` (and so every ``redlease`` command's start) imports no client
    family: each is imported when a client of its own is met (``redlease._clients``)."""
    probe = (
        "import redlease, sys; "
        "print(*[m for m in ('coredis', 'valkey', 'redis') if m in sys.modules])"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert run.stdout.split() == []


_LATE_FAMILY = """
import socket, sys
import redlease
from redlease._clients import ConnectionFailed
import valkey, valkey.exceptions

def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

class Wrapper:  # a client type redlease does not know, around a valkey-py client
    def __init__(self, inner):
        self.inner = inner
    def __getattr__(self, name):
        return getattr(self.inner, name)

for client in (valkey.Valkey(port=free_port()), Wrapper(valkey.Valkey(port=free_port()))):
    try:
        redlease.Lock(client, "x").try_acquire()
    except redlease.BackendError as exc:
        assert "cannot be reached" in str(exc), exc
        assert isinstance(exc.__cause__, valkey.exceptions.ConnectionError), repr(exc.__cause__)
    else:
        raise AssertionError("acquired on a server that is down")
assert issubclass(ConnectionFailed, valkey.exceptions.ConnectionError)
print("coredis" in sys.modules)
"""


def test_a_family_imported_after_redlease_is_served() -> None:
    """valkey-py imported after redlease: its clients are recognised, its errors are
    caught (through a client type redlease does not know too), and redlease's own
    connection errors are its ConnectionError; coredis, unused, is still not imported."""
    run = subprocess.run(
        [sys.executable, "-c", _LATE_FAMILY], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False"]


_BLOCKED_THEN_IMPORTED = """
import sys
sys.modules["valkey"] = None  # blocked, as if not installed
import redis, redlease
from redlease import _clients
assert [f.name for f in _clients.families()] == ["redis-py"]
del sys.modules["valkey"]
import valkey
print(*[f.name for f in _clients.families()])
"""


def test_a_family_blocked_then_imported_is_served() -> None:
    """A package set to None in sys.modules (the usual "not installed" stand-in) is not
    taken for one imported: once really imported, its family is loaded."""
    run = subprocess.run(
        [sys.executable, "-c", _BLOCKED_THEN_IMPORTED], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["redis-py", "valkey-py"]
