"""DAG runs through Airflow's own `dag.test()`, in a Python process that stays for the next run.

A user runs `python dag_file.py` and its `dag.test()`; so do the tests. A fresh interpreter per run
pays, before its first task starts, Airflow's import and its in-process execution API (Cadwyn
builds a router for each of the API's nine versions on the first request): 7-10 s of every such
process on 2 busy cores, longer than most of the runs themselves. A worker pays it once and then
takes one run at a time: it executes the requested DAG file afresh (runpy, as Python runs a
script, without its `__main__` block), so the DAGs are what the file says now, and calls
`dag.test()` on one of them in the environment the request carries.

One worker serves one Airflow configuration: what Airflow reads once, when it is imported (its
home, DAGs folder and database, every AIRFLOW__ option) and, to be safe, the rest of the
environment as well. Only connections and variables (AIRFLOW_CONN_*, AIRFLOW_VAR_*), which Airflow
reads from the environment when a task asks for them, may differ between the runs of a worker.

The warm parent that train tasks fork their CPU jobs from (TRAINPIPE_FORK_LOCAL_JOBS,
launchers/forked.py) stays for the worker's life, as it would in one Python session that runs
several DAG files' `dag.test()`: it reads nothing from a run but the environment, which is the
worker's, and its start (6-12 s on 2 busy cores) is paid once per worker, not once per test.
"""

from __future__ import annotations

import atexit
import json
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

RESULT_MARK = "TEST-RESULT "
READ_WHEN_USED = ("AIRFLOW_CONN_", "AIRFLOW_VAR_")
KEPT_WORKERS = 2  # each holds what its runs imported (MLflow, pandas, GX: a few hundred MB)

# The worker: one JSON request a line on stdin, the run's log on stdout, then its result line.
WORKER = r"""
import json, os, runpy, sys, traceback
from datetime import datetime, timezone

for request in sys.stdin:
    request = json.loads(request)
    os.environ.clear()
    os.environ.update(request["env"])
    try:
        namespace = runpy.run_path(request["path"], run_name="__dag_test_worker__")
        day = datetime.fromisoformat(request["logical_date"]).replace(tzinfo=timezone.utc)
        run = namespace[request["dag"]].test(logical_date=day, run_conf=request["run_conf"])
        tis = {ti.task_id: ti for ti in run.get_task_instances()}
        result = {
            "state": str(run.state),
            "tasks": {k: str(ti.state) for k, ti in tis.items()},
            "tries": {k: ti.try_number for k, ti in tis.items()},
        }
    except Exception:
        traceback.print_exc()
        result = None
    sys.stderr.flush()
    print(MARK + json.dumps(result), flush=True)
""".replace("MARK", repr(RESULT_MARK))


class DagTestWorker:
    def __init__(self, env: Mapping[str, str]):
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-c", WORKER],
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def run(
        self,
        env: Mapping[str, str],
        path: Path,
        dag: str,
        logical_date: str,
        run_conf: dict[str, Any] | None,
        timeout: float,
        on_line: Callable[[str], None] | None,
    ) -> tuple[dict[str, Any] | None, str]:
        """(the run's states and tries, or None when it raised or the worker died; its output)."""
        request = {
            "env": dict(env),
            "path": str(path),
            "dag": dag,
            "logical_date": logical_date,
            "run_conf": run_conf,
        }
        stdin: IO[str] = self.process.stdin  # type: ignore[assignment]
        stdout: IO[str] = self.process.stdout  # type: ignore[assignment]
        stdin.write(json.dumps(request) + "\n")
        stdin.flush()
        killer = threading.Timer(timeout, self.process.kill)  # a hung run: the worker goes with it
        killer.start()
        lines: list[str] = []
        try:
            for line in stdout:
                if line.startswith(RESULT_MARK):
                    return json.loads(line[len(RESULT_MARK) :]), "".join(lines)
                lines.append(line)
                if on_line is not None:
                    on_line(line)
        finally:
            killer.cancel()
        code = self.process.wait()
        lines.append(f"[the dag.test() worker exited with code {code} before the run's result]\n")
        return None, "".join(lines)

    def close(self) -> None:
        if self.alive:
            self.process.stdin.close()  # type: ignore[union-attr]
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_workers: OrderedDict[tuple[tuple[str, str], ...], DagTestWorker] = OrderedDict()
_lock = threading.Lock()


def _configuration(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted(
            (name, value)
            for name, value in env.items()
            if not name.startswith(READ_WHEN_USED) and name != "PYTEST_CURRENT_TEST"
        )
    )


def run_dag(
    env: Mapping[str, str],
    path: Path,
    dag: str,
    logical_date: str,
    *,
    run_conf: dict[str, Any] | None = None,
    timeout: float = 300,
    on_line: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """One `dag.test()` of `dag` (a name the DAG file `path` defines at module level) on
    `logical_date`, in a worker of `env`'s configuration (started on first use): the run's
    {"state", "tasks", "tries"}, or None when dag.test() raised or the run outlived `timeout`,
    and everything the run printed (its traceback included)."""
    key = _configuration(env)
    with _lock:
        worker = _workers.pop(key, None)
        if worker is None or not worker.alive:
            worker = DagTestWorker(env)
        _workers[key] = worker  # the most recently used last
        while len(_workers) > KEPT_WORKERS:
            _workers.popitem(last=False)[1].close()
    return worker.run(env, path, dag, logical_date, run_conf, timeout, on_line)


@atexit.register
def close_workers() -> None:
    with _lock:
        while _workers:
            _workers.popitem()[1].close()
