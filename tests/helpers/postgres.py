"""A throwaway PostgreSQL cluster (Debian's `postgresql`) on 127.0.0.1, for the tests that need one.

`initdb` into a fresh directory, `pg_ctl start` on a free port with trust authentication for
127.0.0.1 only, and `pg_ctl stop` plus the directory removed afterwards. PostgreSQL refuses to run
as root: as root, the cluster belongs to the `postgres` system user (`runuser`).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(
            f"{name} not found: install Debian's postgresql (scripts/ensure_debian_packages.sh)"
        )
    return found[-1]


class PostgresServer:
    def __init__(self, port: int):
        self.port = port
        self.folder = Path(tempfile.mkdtemp(prefix="trainpipe-pg-"))
        self.data = self.folder / "data"
        self._as_user: list[str] = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        """An Airflow-style connection URI (postgres://), as a user would define the connection."""
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *command: str) -> None:
        subprocess.run([*self._as_user, *command], check=True, capture_output=True, timeout=120)

    def __enter__(self) -> PostgresServer:
        if self._as_user:
            shutil.chown(self.folder, "postgres", "postgres")
        self._run(_bin("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            _bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.folder / "log"), "-w", "start"
        )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
