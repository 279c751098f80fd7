"""DistributedTrainOperator: its public surface, and a retry through Airflow's own dag.test()."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_trainpipe.operators.train import DistributedTrainOperator
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.airflow_dags import DagTestRun, dag_test_env, run_dags_of_file


def test_template_fields_are_public_api() -> None:
    assert DistributedTrainOperator.template_fields == (
        "run_id",
        "partition",
        "validation",
        "data_files",
        "data_digest",
        "hyperparameter_overrides",
        "tuned",
    )


def test_accepts_a_config_path_and_defaults_to_the_configs_partition() -> None:
    operator = DistributedTrainOperator(task_id="train", config=str(EXAMPLE_CONFIGS / "fraud_detector.yaml"))
    assert operator.config.pipeline == "fraud_detector"
    assert operator.partition == "ds={{ ds }}"
    assert operator.run_id == "{{ run_id }}"


def test_invalid_hyperparameter_override_fails_without_retry(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    operator = DistributedTrainOperator(
        task_id="train",
        config=str(EXAMPLE_CONFIGS / "fraud_detector.yaml"),
        data_files=[(tmp_path / "x.parquet").as_uri()],
        hyperparameter_overrides={"learning_rate": -1},
    )
    with pytest.raises(AirflowFailException, match=r"invalid hyperparameter_overrides.*learning_rate"):
        operator._spec(store=None, context={})


def test_missing_partition_is_a_retryable_error(tmp_path: Path) -> None:
    from airflow_trainpipe.data.snapshots.errors import SnapshotError

    text = (
        (EXAMPLE_CONFIGS / "fraud_detector.yaml")
        .read_text()
        .replace("uri: data/card_transactions", f"uri: {tmp_path.as_uri()}")
    )
    config_file = tmp_path / "c.yaml"
    config_file.write_text(text)
    operator = DistributedTrainOperator(task_id="train", config=str(config_file), partition="ds=2026-01-01")
    with pytest.raises(
        SnapshotError, match=f"no \\*.parquet files under {tmp_path.as_uri()}/ds=2026-01-01"
    ) as caught:
        operator._spec(store=None, context={})
    assert type(caught.value) is SnapshotError and caught.value.retryable is True


DAG_FILE = """
from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_trainpipe.operators.train import DistributedTrainOperator


class CrashingOnFirstTry(DistributedTrainOperator):
    \"\"\"Try 1's job dies at step 12 (every rank SIGKILLs itself); try 2 runs clean.\"\"\"

    def execute(self, context):
        crash = {{"TRAINPIPE_CRASH_AT": "step:12"}} if context["ti"].try_number == 1 else {{}}
        self.env = {{**self.env, **crash}}
        return super().execute(context)


with DAG("train_retry", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    CrashingOnFirstTry(task_id="train", config={config!r}, data_files={files!r}, max_steps=15,
                       retries=1, retry_delay=timedelta(seconds=0))
"""

OVERWRITE_DAG = """
from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from airflow_trainpipe.operators.train import DistributedTrainOperator
from airflow_trainpipe.operators.validate import DataValidateOperator


@task
def export_rerun(validation):
    # The upstream export runs again between validation and training, rewriting a file in place.
    from datetime import date
    import pyarrow.parquet as pq
    from airflow_trainpipe.examples.synthetic import transactions

    first = validation["manifest"]["files"][0]["uri"]
    pq.write_table(transactions(date(2026, 1, 1), 2500, seed=99), first.removeprefix("file://"))


with DAG("overwritten", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    validate = DataValidateOperator(task_id="validate_data", config={config!r})
    train = DistributedTrainOperator(task_id="train", config={config!r}, validation=validate.output, max_steps=5, retries=2,
                                     retry_delay=timedelta(seconds=0))
    export_rerun(validate.output) >> train
"""


@dataclass
class TrainRuns:
    retry: DagTestRun
    retry_checkpoints: Path
    overwritten: DagTestRun
    overwritten_files: list[str]


@pytest.fixture(scope="module")
def train_runs(
    tmp_path_factory: pytest.TempPathFactory, migrated_airflow_db: Path, migrated_mlflow_db: Path
) -> TrainRuns:
    """Both DAGs of this module, each run once, one after the other in one process: they share
    nothing but the interpreter (their own data, configs and checkpoint roots), and a process of
    its own costs each an interpreter start, an Airflow import and the execution API's start
    (~8 s). Each run's output, states and tries are its own (run_dags_of_file)."""
    from datetime import date

    from airflow_trainpipe.examples.synthetic import write_day

    root = tmp_path_factory.mktemp("train_dags")
    (root / "airflow_home").mkdir()
    retry_root, overwritten_root = root / "retry", root / "overwritten"
    files = write_day((retry_root / "data").as_uri(), date(2026, 1, 1), 3000, seed=9)
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    text = text.replace("uri: checkpoints", f"uri: {(retry_root / 'ckpt').as_uri()}").replace(
        "every_steps: 100", "every_steps: 5"
    )
    text = text.replace("batch_size: 256", "batch_size: 64")
    (retry_root / "train.yaml").write_text(text)

    overwritten_files = write_day((overwritten_root / "data").as_uri(), date(2026, 1, 1), 2500, seed=9)
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    for old, new in (
        ("uri: data/card_transactions", f"uri: {(overwritten_root / 'data').as_uri()}"),
        ("uri: checkpoints", f"uri: {(overwritten_root / 'ckpt').as_uri()}"),
        ("min_rows: 1000", "min_rows: 100"),
    ):
        text = text.replace(old, new)
    (overwritten_root / "train.yaml").write_text(text)

    source = (
        DAG_FILE.format(config=str(retry_root / "train.yaml"), files=files)
        + "\ntrain_retry = dag\n"
        + OVERWRITE_DAG.format(config=str(overwritten_root / "train.yaml"))
        + "\noverwritten = dag\n"
    )
    retry, overwritten = run_dags_of_file(
        # The train task as a worker runs it: the torchrun command, its ranks started cold.
        dag_test_env(
            root / "airflow_home",
            migrated_airflow_db,
            fork_local_jobs=False,
            migrated_mlflow=migrated_mlflow_db,
        ),
        "train_dags",
        source,
        [("train_retry", "2026-01-01"), ("overwritten", "2026-01-01")],
        timeout=600,
    )
    return TrainRuns(retry, retry_root / "ckpt", overwritten, overwritten_files)


@pytest.mark.slow
def test_train_task_dies_on_try_1_and_try_2_resumes(train_runs: TrainRuns) -> None:
    run = train_runs.retry
    output = run.output
    assert (run.state, run.tries["train"]) == ("success", 2), output[-5000:]
    assert output.count("starting torchrun with 2 process(es)") == 2  # the command, on each try
    assert "forking torchrun's agent" not in output
    assert "training job exited with code" in output and "(try 1)" in output
    assert "try 2: the previous try's last complete checkpoint is step 10" in output
    results = list((train_runs.retry_checkpoints / "fraud_detector").glob("*/result.json"))
    assert len(results) == 1
    result = json.loads(results[0].read_text())
    assert (
        result["resumed_from_step"] == 10 and result["final_step"] == 15 and result["steps_recomputed"] == 2
    )


@pytest.mark.slow
def test_a_file_overwritten_between_validate_and_train_fails_train_at_once_naming_it(
    train_runs: TrainRuns,
) -> None:
    run = train_runs.overwritten
    assert run.tasks == {"validate_data": "success", "export_rerun": "success", "train": "failed"}, (
        run.output[-5000:]
    )
    assert run.tries["train"] == 1  # retries=2: bad bytes are not retried
    assert f"ChangedDataError: {train_runs.overwritten_files[0]} changed since it was validated" in run.output
    assert "not retried" in run.output
