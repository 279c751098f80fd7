"""PostgreSQL clusters (Debian's `postgresql`) on 127.0.0.1: the one way this repo starts one.

`PostgresCluster` is a cluster in a folder of its own: `initdb` the first time (its data/ kept
after that), `pg_ctl start` on a given port, listening on 127.0.0.1 only, with trust
authentication for 127.0.0.1 only and no Unix socket (nothing reaches it but loopback TCP), and
`pg_ctl stop`. `make up DB=postgres` keeps one in var/up/postgres/ for Airflow's metadata;
`PostgresServer` is the tests' throwaway one (a fresh temp folder, fsync off, removed afterwards).

This module is the home of both because scripts/ is no package and src/ is the shipped provider:
tests/helpers/ already holds the repo's local servers (MLflow, moto, SMTP, Spark Connect), and
scripts/up.py imports it from the repo root as scripts/soak.py does. PostgreSQL refuses to run as
root: as root, the cluster belongs to the `postgres` system user (`runuser`).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

# Trust for loopback TCP only: no `local` line, so no Unix-socket login either.
PG_HBA = "# trainpipe: trust for 127.0.0.1 only\nhost all all 127.0.0.1/32 trust\n"


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(
            f"{name} not found: install Debian's postgresql (scripts/ensure_debian_packages.sh)"
        )
    return found[-1]


class PostgresCluster:
    """A cluster whose files live in `folder` (data/, log); `durable=False` turns fsync off
    (a throwaway cluster: a crash may lose it, and the tests' writes are ~2x faster)."""

    def __init__(self, folder: Path, port: int, *, durable: bool = True):
        self.folder = folder
        self.data = folder / "data"
        self.log = folder / "log"
        self.port = port
        self.durable = durable
        self._as_user: list[str] = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        """An Airflow-style connection URI (postgres://), as a user would define the connection."""
        return self.database_url("postgres")

    def database_url(self, name: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def _run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run([*self._as_user, *command], capture_output=True, timeout=120, check=False)
        if check and done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace")
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{output}\n{log}")
        return done

    @property
    def running(self) -> bool:
        """pg_ctl's answer: a postmaster runs on data/ (its pid file names a live process)."""
        return (self.data / "PG_VERSION").exists() and self._run(
            _bin("pg_ctl"), "-D", str(self.data), "status", check=False
        ).returncode == 0

    def start(self) -> PostgresCluster:
        """initdb if data/ holds no cluster yet, then start it on `port`. A postmaster left running
        on data/ (its owner was SIGKILLed) is stopped first: the cluster starts on our port."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._as_user:
            shutil.chown(self.folder, "postgres", "postgres")
            self._check_reachable()
        if not (self.data / "PG_VERSION").exists():
            shutil.rmtree(self.data, ignore_errors=True)  # an initdb cut short
            self._run(_bin("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
            (self.data / "pg_hba.conf").write_text(PG_HBA)
            if self._as_user:
                shutil.chown(self.data / "pg_hba.conf", "postgres", "postgres")
        elif self.running:
            self.stop()
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
        if not self.durable:
            options += " -c fsync=off"
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "start")
        return self

    def _check_reachable(self) -> None:
        """As root the cluster runs as `postgres`, which must be able to enter every folder above
        it: not so under a 0700 one (pytest's tmp, /root, a Debian 12 home)."""
        if self._run("test", "-w", str(self.folder), "-a", "-x", str(self.folder), check=False).returncode:
            raise RuntimeError(
                f"PostgreSQL runs as the postgres user here (we are root) and cannot enter {self.folder}: "
                "a folder above it is closed to other users. Put it under a path they can search "
                "(make up: --state), or run as an ordinary user"
            )

    def stop(self, mode: str = "fast") -> None:
        """`pg_ctl stop`: `fast` (sessions cut, a clean shutdown) or `immediate` (no checkpoint:
        the next start recovers, for a cluster about to be removed). A stopped cluster is left be."""
        if self.running:
            self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def ensure_database(self, name: str) -> str:
        """Create database `name` unless it exists; its connection URI (postgres://)."""
        import psycopg

        with psycopg.connect(self.url.replace("postgres://", "postgresql://", 1), autocommit=True) as db:
            if db.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
                db.execute(f'CREATE DATABASE "{name}"')
        return self.database_url(name)


class PostgresServer(PostgresCluster):
    """A throwaway cluster for the tests that need one: a fresh temp folder, fsync off, stopped
    and removed on exit."""

    def __init__(self, port: int):
        super().__init__(Path(tempfile.mkdtemp(prefix="trainpipe-pg-")), port, durable=False)

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
