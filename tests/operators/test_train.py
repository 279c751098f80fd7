"""DistributedTrainOperator: its public surface, and a retry through Airflow's own dag.test()."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_trainpipe.operators.train import DistributedTrainOperator
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.airflow_dags import dag_test_env


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


DAG_FILE = '''
from __future__ import annotations

import json
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_trainpipe.operators.train import DistributedTrainOperator


class CrashingOnFirstTry(DistributedTrainOperator):
    """Try 1's job dies at step 12 (every rank SIGKILLs itself); try 2 runs clean."""

    def execute(self, context):
        crash = {{"TRAINPIPE_CRASH_AT": "step:12"}} if context["ti"].try_number == 1 else {{}}
        self.env = {{**self.env, **crash}}
        return super().execute(context)


with DAG("train_retry", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    CrashingOnFirstTry(task_id="train", config={config!r}, data_files={files!r}, max_steps=15,
                       retries=1, retry_delay=timedelta(seconds=0))

if __name__ == "__main__":
    run = dag.test()
    ti = run.get_task_instance("train")
    print("TEST-RESULT " + json.dumps({{"state": str(run.state), "try_number": ti.try_number}}))
'''


@pytest.mark.slow
def test_train_task_dies_on_try_1_and_try_2_resumes(tmp_path: Path, migrated_airflow_db: Path) -> None:
    from datetime import date

    from airflow_trainpipe.examples.synthetic import write_day

    files = write_day((tmp_path / "data").as_uri(), date(2026, 1, 1), 3000, seed=9)
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    text = text.replace("uri: checkpoints", f"uri: {(tmp_path / 'ckpt').as_uri()}").replace(
        "every_steps: 100", "every_steps: 5"
    )
    text = text.replace("batch_size: 256", "batch_size: 64")
    (tmp_path / "train.yaml").write_text(text)
    env = dag_test_env(tmp_path, migrated_airflow_db)
    dags = Path(env["AIRFLOW__CORE__DAGS_FOLDER"])
    (dags / "train_retry.py").write_text(DAG_FILE.format(config=str(tmp_path / "train.yaml"), files=files))
    done = subprocess.run(
        [sys.executable, str(dags / "train_retry.py")], env=env, capture_output=True, text=True, timeout=600
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    summary = json.loads(output.split("TEST-RESULT ", 1)[1].splitlines()[0])
    assert summary == {"state": "success", "try_number": 2}
    assert "training job exited with code" in output and "(try 1)" in output
    assert "try 2: the previous try's last complete checkpoint is step 10" in output
    results = list((tmp_path / "ckpt" / "fraud_detector").glob("*/result.json"))
    assert len(results) == 1
    result = json.loads(results[0].read_text())
    assert (
        result["resumed_from_step"] == 10 and result["final_step"] == 15 and result["steps_recomputed"] == 2
    )


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


@pytest.mark.slow
def test_a_file_overwritten_between_validate_and_train_fails_train_at_once_naming_it(
    airflow_env: dict[str, str], tmp_path: Path
) -> None:
    from datetime import date

    from airflow_trainpipe.examples.synthetic import write_day
    from tests.helpers.airflow_dags import run_dag_file

    files = write_day((tmp_path / "data").as_uri(), date(2026, 1, 1), 2500, seed=9)
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    for old, new in (
        ("uri: data/card_transactions", f"uri: {(tmp_path / 'data').as_uri()}"),
        ("uri: checkpoints", f"uri: {(tmp_path / 'ckpt').as_uri()}"),
        ("min_rows: 1000", "min_rows: 100"),
    ):
        text = text.replace(old, new)
    (tmp_path / "train.yaml").write_text(text)
    run = run_dag_file(
        airflow_env, "overwritten", OVERWRITE_DAG.format(config=str(tmp_path / "train.yaml")), "2026-01-01"
    )
    assert run.tasks == {"validate_data": "success", "export_rerun": "success", "train": "failed"}, (
        run.output[-5000:]
    )
    assert run.tries["train"] == 1  # retries=2: bad bytes are not retried
    assert f"ChangedDataError: {files[0]} changed since it was validated" in run.output
    assert "not retried" in run.output
