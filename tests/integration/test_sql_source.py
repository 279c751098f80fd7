"""A pipeline whose rows come from PostgreSQL: the factory's five tasks through Airflow's own
dag.test() on a 30-day window of a warehouse table (a throwaway cluster), then the warehouse
changes (a day rewritten, a day deleted) and `trainpipe reproduce` still trains the identical
model from the frozen snapshot.

As docker-compose.yaml runs production, PostgreSQL also holds Airflow's metadata database and
the MLflow server's backend store here (the other end-to-end tests use SQLite for both)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
import yaml

from tests.helpers import warehouse
from tests.helpers.airflow_dags import FACTORY_TASKS, dag_test_env, run_factory_pipeline
from tests.helpers.mlflow_server import start_mlflow_server, stop_mlflow_server
from tests.helpers.openlineage import facets_of, read_events, schema_errors, task_events, transport_env
from tests.helpers.source_configs import assert_reproduces


def _sqlalchemy(cluster_url: str, database: str) -> str:
    """A fresh database on the cluster as an SQLAlchemy URL (psycopg 3, sync and async alike)."""
    created = warehouse.create_database(cluster_url, database)
    return created.replace("postgres://", "postgresql+psycopg://", 1)


def _postgres_metadata(cluster_url: str) -> dict[str, str]:
    """Airflow's metadata database on the cluster, migrated (a fresh schema: a few seconds)."""
    url = _sqlalchemy(cluster_url, "airflow_metadata")
    env = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": url}
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        timeout=300,
    )
    return env


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_30_day_window_from_postgresql_trains_registers_and_reproduces_after_the_source_changed(
    migrated_airflow_db: Path, postgres_server, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from mlflow import MlflowClient

    url = warehouse.create_database(postgres_server.url, "pipeline_from_sql")
    days = [date(2026, 1, 1) + timedelta(days=d) for d in range(31)]
    warehouse.load_days(url, [d for d in days if d != date(2026, 1, 15)], 300, seed=3)
    # The server starts while Airflow's metadata database is migrated: the two overlap.
    server = start_mlflow_server(
        tmp_path / "mlflow", backend_store_uri=_sqlalchemy(postgres_server.url, "mlflow"), wait=False
    )
    request.addfinalizer(lambda: stop_mlflow_server(server.process))
    (tmp_path / "airflow").mkdir()
    env = dag_test_env(tmp_path / "airflow", migrated_airflow_db)  # its own home: nothing shared
    env.update(AIRFLOW_CONN_WAREHOUSE=url, **_postgres_metadata(postgres_server.url))
    server.wait_healthy()
    env.update(AIRFLOW_CONN_MLFLOW_DEFAULT=server.connection_json())
    config = yaml.safe_load(warehouse.sql_config(tmp_path, partitions=30).read_text())
    events = tmp_path / "openlineage.jsonl"
    env.update(transport_env(events))
    run, output = run_factory_pipeline(env, {**config, "pipeline": "fraud_from_sql"}, "2026-01-31")
    assert run["tasks"] == dict.fromkeys(FACTORY_TASKS, "success"), output[-8000:]
    # OpenLineage: the table the window's query read, by the database's name for it, and the
    # snapshot it was frozen into, which train then reads.
    (validated,) = task_events(read_events(events), "fraud_from_sql", "validate_data", "COMPLETE")
    assert schema_errors(validated) == []
    (table,) = validated["inputs"]
    database = urlsplit(url)
    assert (table["namespace"], table["name"]) == (
        f"postgres://{database.hostname}:{database.port}",
        "pipeline_from_sql.public.card_transactions",
    )
    (snapshot,) = validated["outputs"]
    assert facets_of(snapshot)["trainpipe_snapshot"]["origin"].startswith("warehouse")
    # The sensor counts the run's own day; the window is 30 days ending with it: 2026-01-02 ..
    # 2026-01-31, the 15th absent at the source.
    assert "the query on 'warehouse' returns 300 row(s)" in output
    assert "exported 2026-01-02T00:00:00+00:00 .. 2026-02-01T00:00:00+00:00 from warehouse" in output

    assert not (Path(env["TRAINPIPE_HOME"]) / "mlflow.db").exists()  # nothing fell back to SQLite
    metadata = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(metadata) as db:
        assert db.execute("SELECT dag_id, state FROM dag_run").fetchall() == [("fraud_from_sql", "success")]
    client = MlflowClient(server.url)
    os.environ.update(server.client_env())
    request.addfinalizer(lambda: [os.environ.pop(k, None) for k in server.client_env()])
    version = client.get_model_version_by_alias("fraud_from_sql", "champion")
    tags = version.tags
    assert tags["trainpipe.data_source"] == "sql:warehouse"
    assert tags["trainpipe.data_window"] == "2026-01-02T00:00:00+00:00 .. 2026-02-01T00:00:00+00:00"
    manifest = next((tmp_path / "records" / "_trainpipe" / "snapshots").glob("*.json"))
    assert json.loads(manifest.read_text())["digest"] == tags["trainpipe.data_digest"]

    # The warehouse corrects a day and loses another; the model is still reproduced bit for bit.
    warehouse.execute(
        url,
        "UPDATE card_transactions SET amount = amount + 1 WHERE event_time >= '2026-01-20' AND event_time < '2026-01-21'",
        "DELETE FROM card_transactions WHERE event_time >= '2026-01-03' AND event_time < '2026-01-04'",
    )
    assert_reproduces("fraud_from_sql@champion", env)
