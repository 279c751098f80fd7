"""`make up` (scripts/up.py) with real processes: however it is asked to stop (Ctrl-C, SIGTERM,
SIGHUP), neither airflow standalone nor mlflow server outlives it.

up.py starts each child in its own session, so the children's process groups are theirs: the
test records every process of those groups (and every descendant of up.py) once both children
exist, sends the signal to up.py alone, as `kill` or a closing terminal does, and then checks
that up.py exits and that none of them is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from datetime import date, timedelta
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO_ROOT, free_port

pytestmark = pytest.mark.slow

READY = "Ctrl-C (or SIGTERM, SIGHUP) stops everything."
STARTED = "starting mlflow server and airflow standalone"


class Up:
    """scripts/up.py as `make up` runs it, with its state in tmp and free ports; output collected."""

    def __init__(self, state: Path) -> None:
        # The days up.py wants, small: it writes 4 x 20,000 rows (and 7 x 5,000 into the sql
        # example's SQLite table, the iceberg and delta examples' tables and the feature store
        # example) itself when they are missing.
        from airflow_trainpipe.examples.delta_table import write_day_delta
        from airflow_trainpipe.examples.feast_repo import write_feast_example
        from airflow_trainpipe.examples.iceberg_table import write_day_iceberg
        from airflow_trainpipe.examples.synthetic import write_day, write_day_sqlite

        for back in range(7):
            day = date.today() - timedelta(days=back)
            if back < 4:
                write_day((state / "home" / "data" / "card_transactions").as_uri(), day, 200, seed=back)
            write_day_sqlite(state / "home" / "warehouse.db", day, 50, seed=back)
            write_day_iceberg(state / "home" / "lake", day, 50, seed=back)
            write_day_delta(state / "home" / "lake_delta" / "card_transactions", day, 50, seed=back)
        # The feature store example unapplied (up.py only checks that it is there): `feast apply`
        # costs seconds and the example's own tests apply theirs.
        write_feast_example(state / "home" / "feast", date.today() - timedelta(days=6), 7, 50, apply=False)
        env = {**os.environ, "TRAINPIPE_CONFIG_CACHE": str(state / "config-cache")}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-u",
                str(REPO_ROOT / "scripts" / "up.py"),
                "--state",
                str(state),
                "--airflow-port",
                str(free_port()),
                "--mlflow-port",
                str(free_port()),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.state = state

    def _read(self) -> None:
        for line in self.process.stdout:  # type: ignore[union-attr]
            self.lines.append(line)

    def wait_for_line(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = self.state / "airflow" / "standalone.log"
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise AssertionError(
                    f"up.py did not print {text!r} (exit {self.process.returncode}):\n{''.join(self.lines)}\n{tail}"
                )
            time.sleep(0.5)

    def children(self) -> dict[str, psutil.Process]:
        """The direct children by what they run: airflow standalone, mlflow server and, once
        Airflow answers, the canary example's callers (trainpipe canary-replay)."""
        found = {}
        for child in psutil.Process(self.process.pid).children():
            command = " ".join(child.cmdline())
            if "airflow standalone" in command:
                found["airflow"] = child
            elif "mlflow server" in command:
                found["mlflow"] = child
            elif "canary-replay" in command:
                found["canary-replay"] = child
        return found


def _groups(pgids: set[int]) -> list[psutil.Process]:
    """Live processes (zombies are dead) whose process group is one of `pgids`."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) in pgids and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return members


def _alive(processes: Iterable[psutil.Process]) -> list[str]:
    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{process.pid} {' '.join(process.cmdline())[:160]}")
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.mark.parametrize(
    ("signum", "when"),
    [
        (signal.SIGTERM, "starting"),  # both children exist, Airflow is not up yet
        (signal.SIGHUP, "starting"),
        (signal.SIGTERM, "ready"),  # Airflow answered its health check and up.py printed the login
    ],
)
def test_up_stops_airflow_and_mlflow_on_signal(signum: signal.Signals, when: str, tmp_path: Path) -> None:
    up = Up(tmp_path / "up")
    try:
        up.wait_for_line(STARTED, 120)
        if when == "ready":
            up.wait_for_line(READY, 360)
        deadline = time.monotonic() + 30
        while len(children := up.children()) < (3 if when == "ready" else 2):
            assert time.monotonic() < deadline, f"children of up.py: {children}"
            time.sleep(0.2)
        pgids = {os.getpgid(child.pid) for child in children.values()}
        assert pgids == {child.pid for child in children.values()}  # each child leads its own group
        watched = _groups(pgids) + psutil.Process(up.process.pid).children(recursive=True)
        assert len(watched) >= 2

        os.kill(up.process.pid, signum)
        # stop() gives each group 30 s to exit on SIGTERM, then SIGKILLs what is left of it.
        code = up.process.wait(timeout=120)
        deadline = time.monotonic() + 15
        while (
            left := _alive({p.pid: p for p in watched + _groups(pgids)}.values())
        ) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == [], (
            f"survived up.py ({signal.Signals(signum).name} while {when}, exit {code}):\n" + "\n".join(left)
        )
        assert code == 0, "".join(up.lines)
        assert f"{signal.Signals(signum).name}: stopping airflow and mlflow" in "".join(up.lines)
    finally:
        if up.process.poll() is None:
            up.process.kill()
        for pgid in pgids if "pgids" in locals() else ():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)  # a failed test leaves nothing behind either
