"""DataValidateOperator with `validation.engine: spark`, in dag.test(), against a real Spark
Connect server named by the worker's SPARK_REMOTE: a clean day goes on to the train task, a
broken day fails validate_data and nothing downstream runs.

The downstream task stands in for `train` (it reads the validated manifest from XCom, as the
real one does, and prints it): a real training run costs a minute of this suite's budget, and
what is tested here is where validation stops the run, not the training."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_trainpipe.examples.synthetic import Problem, write_day
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.airflow_dags import run_dag_file_for_dates

DAG = """
from datetime import datetime

from airflow.sdk import DAG, task

from airflow_trainpipe.operators.validate import DataValidateOperator

with DAG("validate_spark_engine", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False) as dag:
    validated = DataValidateOperator(task_id="validate_data", config={config!r}, retries=0)

    @task(retries=0)
    def train(summary):
        print("TRAINING ON", summary["manifest"]["digest"], "rows", summary["manifest"]["rows"])

    train(validated.output)
"""


@pytest.mark.slow
def test_clean_data_trains_and_bad_data_stops_before_training(
    airflow_env: dict[str, str], spark_connect: Any, tmp_path: Path
) -> None:
    data = (tmp_path / "data").as_uri()
    write_day(data, date(2026, 1, 1), 1200)
    write_day(data, date(2026, 1, 2), 1200, problems=[Problem.parse("out_of_range:amount")])
    raw = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text())
    raw["data"]["uri"] = data
    raw["validation"]["engine"] = "spark"  # no spark_remote: the worker's SPARK_REMOTE names the server
    config = tmp_path / "fraud_detector.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))

    first, second = run_dag_file_for_dates(
        {**airflow_env, "SPARK_REMOTE": spark_connect.url},
        "validate_spark_engine",
        DAG.format(config=str(config)),
        ["2026-01-01", "2026-01-02"],
    )
    assert first.tasks == {"validate_data": "success", "train": "success"}, first.output[-6000:]
    assert f"validation.engine spark: the expectations and drift profiles run on {spark_connect.url}" in (
        first.output
    )
    assert "volume:files_unchanged" not in first.output  # passed: not in a failure table
    assert "TRAINING ON sha256:" in first.output and "rows 1200" in first.output
    assert second.tasks == {"validate_data": "failed", "train": "upstream_failed"}, second.output[-6000:]
    assert "expect_column_values_to_be_between(amount): " in second.output, second.output[-6000:]
    assert "DataValidationFailed" in second.output and "TRAINING ON" not in second.output
