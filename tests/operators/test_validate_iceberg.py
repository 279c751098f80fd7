"""DataValidateOperator on an iceberg source, in dag.test(): an undefined connection, a table that
does not exist, a column the pipeline needs missing, a time column of the wrong type, a window
without rows and a data file of the snapshot gone each fail the task at once naming the pipeline,
the source and the cause (nothing is frozen, so nothing trains or is registered); a catalog that
cannot be reached is retried."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest
import yaml

from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.examples.iceberg_table import connection
from tests.helpers import iceberg_lake
from tests.helpers.airflow_dags import run_dag_file

DAG = """
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_trainpipe.operators.validate import DataValidateOperator

with DAG("validate_iceberg", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    for task_id, config in {configs!r}.items():
        DataValidateOperator(task_id=task_id, config=config, retries=1, retry_delay=timedelta(0))
"""
NAMES = [c.strip() for c in iceberg_lake.COLUMNS.split(",")]
# task id: (data.source fields changed, the cause the task's error names)
CASES = {
    "no_connection": ({"conn_id": "nowhere"}, "Airflow connection 'nowhere' is not defined"),
    "no_table": ({"table": "sales.card_transaction"}, "it does not exist (data.source.table)"),
    "missing_column": (
        {"columns": [n for n in NAMES if n != "merchant_risk"]},
        "the result has no column 'merchant_risk', which the pipeline reads",
    ),
    "mistyped_time_column": ({"time_column": "hour"}, "time_column 'hour' of Iceberg table"),
    "empty_window": ({"table": "sales.last_year"}, "has no rows in the run's window"),
    "file_gone": ({"table": "sales.damaged"}, "a file of the snapshot being read no longer exists"),
    "unreachable": ({"conn_id": "down"}, "ConnectionError"),
}


@pytest.mark.slow
def test_bad_iceberg_input_stops_before_training_and_only_an_unreachable_catalog_is_retried(
    airflow_env: dict[str, str], tmp_path: Path
) -> None:
    from tests.conftest import free_port

    catalog = tmp_path / "catalog"
    iceberg_lake.write_days(iceberg_lake.table(catalog), [date(2026, 1, 2)], 100)  # the run's day
    iceberg_lake.write_days(
        iceberg_lake.table(catalog, identifier="sales.last_year"), [date(2025, 1, 2)], 100
    )
    damaged = iceberg_lake.table(catalog, identifier="sales.damaged")
    iceberg_lake.write_days(damaged, [date(2026, 1, 2)], 100)
    local_path(next(iter(damaged.refresh().scan().plan_files())).file.file_path).unlink()
    configs = {}
    for task_id, (fields, _) in CASES.items():
        folder = tmp_path / task_id
        folder.mkdir()
        config = yaml.safe_load(iceberg_lake.iceberg_config(folder).read_text())
        config["pipeline"] = f"iceberg_{task_id}"
        config["data"]["source"].update(fields)
        path = folder / "pipeline.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        configs[task_id] = str(path)
    rest = {"conn_type": "iceberg", "host": f"http://127.0.0.1:{free_port()}", "extra": {}}
    env = {**airflow_env, "AIRFLOW_CONN_LAKE": connection(catalog), "AIRFLOW_CONN_DOWN": json.dumps(rest)}
    env.pop("AIRFLOW_CONN_NOWHERE", None)
    run = run_dag_file(env, "validate_iceberg", DAG.format(configs=configs))
    assert run.tasks == dict.fromkeys(CASES, "failed"), run.output[-6000:]
    assert run.tries == {**dict.fromkeys(CASES, 1), "unreachable": 2}, run.output[-6000:]
    for task_id, (fields, cause) in CASES.items():
        table = fields.get("table", iceberg_lake.TABLE)
        conn_id = fields.get("conn_id", iceberg_lake.CONN_ID)
        where = f"pipeline iceberg_{task_id}, data.source iceberg ({table}, connection {conn_id}): "
        assert where in run.output, (task_id, run.output[-6000:])
        assert cause in run.output, (task_id, run.output[-6000:])
    assert "SourceUnavailable is retryable" in run.output and "SourceError is not retryable" in run.output
    assert not (tmp_path / "missing_column" / "snapshots").exists()  # nothing frozen
