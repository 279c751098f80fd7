"""DataValidateOperator in dag.test(): a clean day hands the snapshot's exact files downstream; a
drifted day fails at once (no retry), with the report written and nothing downstream run."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from airflow_trainpipe.operators.validate import DataValidateOperator
from airflow_trainpipe.synthetic import Problem, write_day
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.airflow_dags import run_dag_file_for_dates

DAG_SOURCE = """
from datetime import datetime

from airflow.sdk import DAG, task

from airflow_trainpipe.operators.validate import DataValidateOperator


@task
def train(validation):
    # What DistributedTrainOperator receives in the pipeline: the summary with the manifest.
    from airflow_trainpipe.digest import content_digest
    from airflow_trainpipe.payloads import ValidationSummary

    summary = ValidationSummary.model_validate(validation)
    data_files = summary.manifest.file_uris
    assert content_digest(data_files) == summary.digest
    print("TRAINS-ON " + " ".join(data_files) + " " + summary.digest)


with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    validate = DataValidateOperator(task_id="validate_data", config={config!r}, retries=2)
    train(validate.output)
"""


def test_template_fields_are_the_public_api() -> None:
    assert DataValidateOperator.template_fields == ("partition", "conn_id")
    operator = DataValidateOperator(task_id="v", config=str(EXAMPLE_CONFIGS / "fraud_detector.yaml"))
    assert operator.partition == "ds={{ ds }}"


@pytest.mark.slow
def test_clean_day_trains_on_the_snapshot_and_drifted_day_stops_before_training(
    airflow_env: dict[str, str], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    write_day(data.as_uri(), date(2026, 1, 1), 3000, seed=1)
    write_day(data.as_uri(), date(2026, 1, 2), 3000, seed=1, problems=[Problem.parse("drift:amount")])
    text = (
        (EXAMPLE_CONFIGS / "fraud_detector.yaml")
        .read_text()
        .replace("uri: data/card_transactions", f"uri: {data.as_uri()}")
    )
    config = tmp_path / "fraud_detector.yaml"
    config.write_text(text)
    source = DAG_SOURCE.format(dag_id="validate_then_train", config=str(config))

    clean, drifted = run_dag_file_for_dates(
        airflow_env, "validate_then_train", source, ["2026-01-01", "2026-01-02"]
    )
    assert (clean.state, clean.tasks) == ("success", {"validate_data": "success", "train": "success"}), (
        clean.output[-5000:]
    )
    snapshots = [json.loads(path.read_text()) for path in (data / "_trainpipe" / "snapshots").glob("*.json")]
    (snapshot,) = [s for s in snapshots if all("/ds=2026-01-01/" in f["uri"] for f in s["files"])]
    files = " ".join(f["uri"] for f in snapshot["files"])
    assert f"TRAINS-ON {files} {snapshot['digest']}" in clean.output
    assert (
        f"snapshot {snapshot['digest']}" in clean.output and "all 8 check(s) passed" in clean.output
    )  # schema, 2 volume, 5 expectations

    assert drifted.state == "failed", drifted.output[-5000:]
    assert drifted.tasks == {"validate_data": "failed", "train": "upstream_failed"}
    assert drifted.tries["validate_data"] == 1  # retries=2, yet bad data is not retried
    assert "failed validation (drift: amount)" in drifted.output
    report = json.loads(
        next((data / "ds=2026-01-02" / "_trainpipe" / "fraud_detector").glob("*/report.json")).read_text()
    )
    assert report["passed"] is False and report["reference"]["partition"] == "ds=2026-01-01"
    assert [c["column"] for c in report["checks"] if not c["passed"]] == ["amount"]
    assert "TRAINS-ON" not in drifted.output


ESCAPING_PARTITION_DAG = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_trainpipe.config import load_config
from airflow_trainpipe.operators.train import DistributedTrainOperator
from airflow_trainpipe.operators.validate import DataValidateOperator
from airflow_trainpipe.sensors.snapshot import DataSnapshotSensor

config = load_config({config!r})
# The trigger form's partition reaches the tasks through a template, as in the factory's DAGs.
with DAG("escaping_partition", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         params={{"partition": "../outside/ds=2026-01-01"}}) as dag:
    partition = "{{{{ params.partition }}}}"
    DataSnapshotSensor(task_id="wait_for_data", data=config.data, partition=partition, mode="poke",
                       poke_interval=1, timeout=30, retries=2)
    DataValidateOperator(task_id="validate_data", config=config, partition=partition, retries=2)
    DistributedTrainOperator(task_id="train", config=config, partition=partition, retries=2)
"""


@pytest.mark.slow
def test_a_partition_that_leaves_data_uri_fails_every_task_at_once(
    airflow_env: dict[str, str], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    # A real partition outside data.uri: before the check, the tasks read it and wrote reports there.
    write_day((tmp_path / "outside").as_uri(), date(2026, 1, 1), 1500, seed=1)
    text = (
        (EXAMPLE_CONFIGS / "fraud_detector.yaml")
        .read_text()
        .replace("uri: data/card_transactions", f"uri: {data.as_uri()}")
    )
    config = tmp_path / "fraud_detector.yaml"
    config.write_text(text)
    (run,) = run_dag_file_for_dates(
        airflow_env, "escaping_partition", ESCAPING_PARTITION_DAG.format(config=str(config)), ["2026-01-01"]
    )
    assert run.tasks == dict.fromkeys(("wait_for_data", "validate_data", "train"), "failed"), run.output[
        -5000:
    ]
    assert run.tries == dict.fromkeys(
        ("wait_for_data", "validate_data", "train"), 1
    )  # retries=2: not retried
    assert run.output.count("partition '../outside/ds=2026-01-01' (under data.uri") >= 3
    assert not (tmp_path / "outside" / "_trainpipe").exists()
    assert not (tmp_path / "outside" / "ds=2026-01-01" / "_trainpipe").exists()
