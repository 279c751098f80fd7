"""Run a DAG file through Airflow's own `dag.test()`, as a user would (in a process that stays
for the next run: tests/helpers/dag_test_worker.py).

`dag.test()` needs the DAG in a file of the configured dags folder and a migrated metadata DB;
the DB is migrated once per session (`migrated_airflow_db` in conftest.py) and each Airflow home
gets a copy of it (`airflow db migrate` costs a process start and every migration).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import fresh_mlflow_store
from tests.helpers.dag_test_worker import RESULT_MARK as RESULT_MARK  # the runners of their own print it
from tests.helpers.dag_test_worker import run_dag


def dag_test_env(
    root: Path, migrated_db: Path, *, fork_local_jobs: bool = True, migrated_mlflow: Path | None = None
) -> dict[str, str]:
    """Environment of an Airflow home under `root` (a copy of the migrated DB), with the dags
    folder `root/dags` and TRAINPIPE_HOME `root/home`.

    `migrated_mlflow` (conftest's `migrated_mlflow_db`): TRAINPIPE_HOME's embedded MLflow store
    starts as a copy of it. Without it, the first task that tracks creates the store.

    `fork_local_jobs`: the train tasks fork their CPU jobs from the worker's warm parent
    (TRAINPIPE_FORK_LOCAL_JOBS, launchers/forked.py), as a user's own `dag.test()` session may:
    the runs of the worker share its imports, ~7 s less per job than the torchrun command.
    The train task under the command is tests/operators/test_train.py's (False there) and the
    standalone stack's, whose task processes run it as an Airflow worker does."""
    from airflow_trainpipe.launchers.forked import FORK_LOCAL_JOBS_ENV

    (root / "dags").mkdir()
    (root / "airflow").mkdir()
    shutil.copy2(migrated_db, root / "airflow" / "airflow.db")
    if migrated_mlflow is not None:
        fresh_mlflow_store(root / "home", migrated_mlflow)
    return {
        **os.environ,
        "AIRFLOW_HOME": str(root / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(root / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TRAINPIPE_HOME": str(root / "home"),
        FORK_LOCAL_JOBS_ENV: "1" if fork_local_jobs else "0",
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
    """One run of the DAG `source` names `dag` per logical date, in order (run_dags_of_file).

    before_run(date) is called before each run but the first: the test rewrites or removes
    partitions between the runs."""
    return run_dags_of_file(
        env,
        name,
        source,
        [("dag", logical_date) for logical_date in logical_dates],
        timeout,
        on_line,
        None if before_run is None else lambda number: before_run(logical_dates[number]),
    )


def run_dags_of_file(
    env: dict[str, str],
    name: str,
    source: str,
    runs: list[tuple[str, str]],
    timeout: float = 300,
    on_line: Callable[[str], None] | None = None,
    before_run: Callable[[int], None] | None = None,
) -> list[DagTestRun]:
    """One run per (DAG variable of `source`, logical date) in `runs`, in order, written to the
    dags folder as `name`.py and run by the dag.test() worker of `env` (tests/helpers/
    dag_test_worker.py: one interpreter start and Airflow import for them all, and for the next
    test's runs in the same Airflow home, and one warm parent their jobs fork from). `timeout`
    applies to each run; `on_line` sees each line of output as it comes (to act while a task
    runs).

    before_run(index) is called before each run but the first."""
    path = Path(env["AIRFLOW__CORE__DAGS_FOLDER"]) / f"{name}.py"
    path.write_text(source)
    results: list[DagTestRun] = []
    for number, (dag, logical_date) in enumerate(runs):
        if number and before_run is not None:
            before_run(number)
        result, output = run_dag(
            env,
            path,
            dag,
            logical_date,
            timeout=timeout,
            on_line=on_line,
        )
        if result is None:
            raise AssertionError(
                f"dag.test() of {dag} in {name} on {logical_date} gave no result (run {number + 1} "
                f"of {len(runs)}):\n{output[-6000:]}"
            )
        results.append(DagTestRun(output=output, **result))
    return results


FACTORY_TASKS = ["wait_for_data", "validate_data", "train", "gate", "register"]

# The factory's DAGs, as a dags folder's loader file registers them.
FACTORY_DAG_FILE = """
# Airflow DAGs of the factory (Airflow's safe mode parses only files that mention "airflow" and "dag").
from pathlib import Path

from airflow_trainpipe.factory import register_pipelines

register_pipelines(Path(__file__).parent / "configs", globals())
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
    path = dags / "pipeline.py"
    path.write_text(FACTORY_DAG_FILE)
    result, output = run_dag(env, path, config["pipeline"], logical_date, run_conf=run_conf, timeout=timeout)
    assert result is not None, output[-8000:]
    return {"state": result["state"], "tasks": result["tasks"]}, output
