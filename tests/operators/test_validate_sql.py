"""DataValidateOperator on a sql source, in dag.test(): a query the database refuses, a column the
pipeline needs missing or mistyped, and a window without rows each fail the task at once naming
the pipeline, the source and the cause; a database that cannot be reached is retried."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
import yaml

from tests.helpers import warehouse
from tests.helpers.airflow_dags import run_dag_file

DAG = """
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_trainpipe.operators.validate import DataValidateOperator

with DAG("validate_sql", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    for task_id, config in {configs!r}.items():
        DataValidateOperator(task_id=task_id, config=config, retries=1, retry_delay=timedelta(0))
"""
SELECT = warehouse.COLUMNS
CASES = {
    "wrong_query": (f"SELECT {SELECT} FROM card_transaction", 'relation "card_transaction" does not exist'),
    "missing_column": (
        f"SELECT {SELECT.replace('merchant_risk, ', '')} FROM card_transactions",
        "the result has no column 'merchant_risk', which the pipeline reads",
    ),
    "mistyped_column": (
        f"SELECT {SELECT.replace('amount,', 'amount::text AS amount,')} FROM card_transactions",
        "numeric feature 'amount' is string in the result; cast it to a number in the query",
    ),
    "empty_window": (warehouse.WINDOW_QUERY, "returned no rows for the run's window"),
    "unreachable": (warehouse.WINDOW_QUERY, "OperationalError"),
}


@pytest.mark.slow
def test_bad_sql_input_stops_before_training_and_only_an_unreachable_database_is_retried(
    airflow_env: dict[str, str], postgres_server, tmp_path: Path
) -> None:
    from tests.conftest import free_port

    url = warehouse.create_database(postgres_server.url, "validate_sql")
    warehouse.load_days(url, [date(2026, 1, 1)], 100)  # the run's day (01-02) has no rows
    configs = {}
    for task_id, (query, _) in CASES.items():
        folder = tmp_path / task_id
        folder.mkdir()
        config = yaml.safe_load(warehouse.sql_config(folder).read_text())
        config["pipeline"] = f"sql_{task_id}"
        config["data"]["source"]["query"] = query
        if task_id == "unreachable":
            config["data"]["source"]["conn_id"] = "down"
        path = folder / "pipeline.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        configs[task_id] = str(path)
    env = {
        **airflow_env,
        "AIRFLOW_CONN_WAREHOUSE": url,
        "AIRFLOW_CONN_DOWN": f"postgres://postgres@127.0.0.1:{free_port()}/postgres",
    }
    run = run_dag_file(env, "validate_sql", DAG.format(configs=configs))
    assert run.tasks == dict.fromkeys(CASES, "failed"), run.output[-6000:]
    assert run.tries == {**dict.fromkeys(CASES, 1), "unreachable": 2}, run.output[-6000:]
    for task_id, (_, cause) in CASES.items():
        assert f"pipeline sql_{task_id}, data.source sql (" in run.output
        assert cause in run.output, (task_id, run.output[-6000:])
    assert "SourceUnavailable is retryable" in run.output and "SourceError is not retryable" in run.output
