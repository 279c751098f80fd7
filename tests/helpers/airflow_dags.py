"""Run a DAG file through Airflow's own `dag.test()` in a fresh process, as a user would.

`dag.test()` needs the DAG in a file of the configured dags folder and a migrated metadata DB;
the DB is migrated once per session (`migrated_airflow_db` in conftest.py) and each Airflow home
gets a copy of it (`airflow db migrate` costs a process start and every migration).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULT_MARK = "TEST-RESULT "

# Appended to each DAG file: run it once per logical date and print the states (and XComs) the
# test asserts on, flushed, so each run's output ends at its result line. With wait_between, each
# run after the first waits for a line on stdin: the test changes the data in between.
RUNNER = """
if __name__ == "__main__":
    import json as _json
    import sys as _sys
    from datetime import datetime as _datetime, timezone as _timezone

    for _number, _date in enumerate({logical_dates!r}):
        if _number and {wait_between!r}:
            _sys.stdin.readline()  # the test's before_run is done
        _run = dag.test(logical_date=_datetime.fromisoformat(_date).replace(tzinfo=_timezone.utc))
        _tis = {{ti.task_id: ti for ti in _run.get_task_instances()}}
        print({mark!r} + _json.dumps({{
            "state": str(_run.state),
            "tasks": {{k: str(ti.state) for k, ti in _tis.items()}},
            "tries": {{k: ti.try_number for k, ti in _tis.items()}},
        }}), flush=True)
"""


def dag_test_env(root: Path, migrated_db: Path) -> dict[str, str]:
    """Environment of an Airflow home under `root` (a copy of the migrated DB), with the dags
    folder `root/dags` and TRAINPIPE_HOME `root/home`."""
    (root / "dags").mkdir()
    (root / "airflow").mkdir()
    shutil.copy2(migrated_db, root / "airflow" / "airflow.db")
    return {
        **os.environ,
        "AIRFLOW_HOME": str(root / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TRAINPIPE_HOME": str(root / "home"),
    }


@dataclass
class DagTestRun:
    state: str
    tasks: dict[str, str]
    tries: dict[str, int]
    output: str


def run_dag_file(
    env: dict[str, str],
    name: str,
    source: str,
    logical_date: str = "2026-01-02",
    timeout: float = 300,
    on_line: Callable[[str], None] | None = None,
) -> DagTestRun:
    """Run the DAG once; `on_line` sees each output line as it comes (to act while a task runs)."""
    (run,) = run_dag_file_for_dates(env, name, source, [logical_date], timeout, on_line)
    return run


def run_dag_file_for_dates(
    env: dict[str, str],
    name: str,
    source: str,
    logical_dates: list[str],
    timeout: float = 300,
    on_line: Callable[[str], None] | None = None,
    before_run: Callable[[str], None] | None = None,
) -> list[DagTestRun]:
    """One DAG run per logical date, in order, in one process (one interpreter start and DAG parse).

    before_run(date) is called before each run but the first, while the process waits for it: the
    test rewrites or removes partitions between the runs of one process."""
    dags = Path(env["AIRFLOW__CORE__DAGS_FOLDER"])
    path = dags / f"{name}.py"
    runner = RUNNER.format(logical_dates=logical_dates, mark=RESULT_MARK, wait_between=before_run is not None)
    path.write_text(source + runner)
    process = subprocess.Popen(
        [sys.executable, str(path)],
        env=env,
        stdin=subprocess.PIPE if before_run is not None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    killer = threading.Timer(timeout, process.kill)
    killer.start()
    lines = []
    finished = 0
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if on_line is not None:
                on_line(line)
            if RESULT_MARK in line:
                finished += 1
                if before_run is not None and finished < len(logical_dates):
                    before_run(logical_dates[finished])
                    process.stdin.write("\n")  # type: ignore[union-attr]
                    process.stdin.flush()  # type: ignore[union-attr]
        code = process.wait()
    finally:
        killer.cancel()
        process.kill()
    runs: list[DagTestRun] = []
    segment: list[str] = []
    for line in lines:
        segment.append(line)
        if RESULT_MARK in line:
            summary: dict[str, Any] = json.loads(line.split(RESULT_MARK, 1)[1])
            runs.append(DagTestRun(output="".join(segment), **summary))
            segment = []
    if len(runs) != len(logical_dates):
        raise AssertionError(
            f"dag.test() of {name} printed {len(runs)} of {len(logical_dates)} results (exit {code}):\n{''.join(lines)[-6000:]}"
        )
    runs[-1].output += "".join(segment)  # what the process printed after the last run
    return runs


FACTORY_TASKS = ["wait_for_data", "validate_data", "train", "gate", "register"]

# The factory's DAGs, then one dag.test() of {dag_id!r} on {logical_date!r}, its task states printed.
FACTORY_DAG_FILE = """
# Airflow DAGs of the factory (Airflow's safe mode parses only files that mention "airflow" and "dag").
import json
from datetime import datetime, timezone
from pathlib import Path

from airflow_trainpipe.factory import register_pipelines

register_pipelines(Path(__file__).parent / "configs", globals())

if __name__ == "__main__":
    run = globals()[{dag_id!r}].test(
        logical_date=datetime.fromisoformat({logical_date!r}).replace(tzinfo=timezone.utc), run_conf={run_conf!r}
    )
    tasks = {{ti.task_id: str(ti.state) for ti in run.get_task_instances()}}
    print({mark!r} + json.dumps({{"state": str(run.state), "tasks": tasks}}), flush=True)
"""


def run_factory_pipeline(
    env: dict[str, str],
    config: dict[str, Any],
    logical_date: str,
    timeout: float = 540,
    run_conf: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], str]:
    """One run of the pipeline `config` declares, as the factory builds it from the dags folder
    of `env`, for a short training: one epoch, and the first model promoted whatever its score
    (the path is tested, not the model); `run_conf`: the trigger form's values. Returns the run's
    states and the whole output."""
    import yaml

    config = {**config, "register": {k: v for k, v in config["register"].items() if k != "model_name"}}
    config["training"]["hyperparameters"]["epochs"] = 1
    config["gate"]["no_champion"]["min_value"] = 0.0
    dags = Path(env["AIRFLOW__CORE__DAGS_FOLDER"])
    (dags / "configs").mkdir(exist_ok=True)
    (dags / "configs" / f"{config['pipeline']}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    source = FACTORY_DAG_FILE.format(
        dag_id=config["pipeline"], logical_date=logical_date, mark=RESULT_MARK, run_conf=run_conf
    )
    (dags / "pipeline.py").write_text(source)
    done = subprocess.run(
        [sys.executable, str(dags / "pipeline.py")], env=env, capture_output=True, text=True, timeout=timeout
    )
    output = done.stdout + done.stderr
    runs = [
        json.loads(line.split(RESULT_MARK, 1)[1]) for line in done.stdout.splitlines() if RESULT_MARK in line
    ]
    assert len(runs) == 1, output[-8000:]
    return runs[0], output


# Appended to a DAG file that defines several DAGs: one dag.test() per (DAG variable, logical
# date), in order, in one process, each run's states printed as RUNNER prints them. With
# wait_between, each run after the first waits for a line on stdin: the test changes the data.
RUNNER_OF_DAGS = """
if __name__ == "__main__":
    import json as _json
    import sys as _sys
    from datetime import datetime as _datetime, timezone as _timezone

    for _number, (_dag_var, _date) in enumerate({runs!r}):
        if _number and {wait_between!r}:
            _sys.stdin.readline()  # the test's before_run is done
        _run = globals()[_dag_var].test(logical_date=_datetime.fromisoformat(_date).replace(tzinfo=_timezone.utc))
        _tis = {{ti.task_id: ti for ti in _run.get_task_instances()}}
        print({mark!r} + _json.dumps({{
            "state": str(_run.state),
            "tasks": {{k: str(ti.state) for k, ti in _tis.items()}},
            "tries": {{k: ti.try_number for k, ti in _tis.items()}},
        }}), flush=True)
"""


def run_dags_of_file(
    env: dict[str, str],
    name: str,
    source: str,
    runs: list[tuple[str, str]],
    timeout: float = 300,
    on_line: Callable[[str], None] | None = None,
    before_run: Callable[[int], None] | None = None,
) -> list[DagTestRun]:
    """One run per (DAG variable of `source`, logical date) in `runs`, in order, in one process:
    independent DAGs share one interpreter start, Airflow import and parse. Each run's output is
    its own, as run_dag_file_for_dates splits it.

    before_run(index) is called before each run but the first, while the process waits for it."""
    dags = Path(env["AIRFLOW__CORE__DAGS_FOLDER"])
    path = dags / f"{name}.py"
    runner = RUNNER_OF_DAGS.format(runs=runs, mark=RESULT_MARK, wait_between=before_run is not None)
    path.write_text(source + runner)
    process = subprocess.Popen(
        [sys.executable, str(path)],
        env=env,
        stdin=subprocess.PIPE if before_run is not None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    killer = threading.Timer(timeout, process.kill)
    killer.start()
    lines = []
    finished = 0
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if on_line is not None:
                on_line(line)
            if RESULT_MARK in line:
                finished += 1
                if before_run is not None and finished < len(runs):
                    before_run(finished)
                    process.stdin.write("\n")  # type: ignore[union-attr]
                    process.stdin.flush()  # type: ignore[union-attr]
        code = process.wait()
    finally:
        killer.cancel()
        process.kill()
    results: list[DagTestRun] = []
    segment: list[str] = []
    for line in lines:
        segment.append(line)
        if RESULT_MARK in line:
            summary: dict[str, Any] = json.loads(line.split(RESULT_MARK, 1)[1])
            results.append(DagTestRun(output="".join(segment), **summary))
            segment = []
    if len(results) != len(runs):
        raise AssertionError(
            f"dag.test() of {name} printed {len(results)} of {len(runs)} results (exit {code}):\n{''.join(lines)[-6000:]}"
        )
    results[-1].output += "".join(segment)  # what the process printed after the last run
    return results
