"""A pipeline whose rows come from an Apache Iceberg table: the factory's five tasks through
Airflow's own dag.test() on a 30-day window of a table partitioned by day(event_time) in a SQL
catalog (SQLite, a local warehouse) opened through Airflow's Iceberg hook; then a day is
overwritten and the old snapshots expire, their files deleted (the snapshot trained on is gone
at the source), and `trainpipe reproduce` still trains the identical model from the frozen
snapshot."""

from __future__ import annotations

import json
from datetime import date, timedelta
from pathlib import Path

import pytest
import yaml

from airflow_trainpipe.examples.iceberg_table import connection
from tests.helpers import iceberg_lake
from tests.helpers.airflow_dags import FACTORY_TASKS, run_factory_pipeline
from tests.helpers.source_configs import assert_reproduces


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_30_day_window_from_iceberg_trains_registers_and_reproduces_after_the_snapshot_expired(
    airflow_env: dict[str, str], tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    table = iceberg_lake.table(tmp_path / "lake")
    days = [date(2026, 1, 1) + timedelta(days=d) for d in range(31)]
    iceberg_lake.write_days(table, [d for d in days if d != date(2026, 1, 15)], 300, seed=3)
    snapshot_id = table.refresh().current_snapshot().snapshot_id
    env = {**airflow_env, "AIRFLOW_CONN_LAKE": connection(tmp_path / "lake")}
    config = yaml.safe_load(iceberg_lake.iceberg_config(tmp_path, partitions=30).read_text())
    run, output = run_factory_pipeline(env, {**config, "pipeline": "fraud_from_iceberg"}, "2026-01-31")
    assert run["tasks"] == dict.fromkeys(FACTORY_TASKS, "success"), output[-8000:]
    # The sensor counts the run's own day; the window is 30 days ending with it: 2026-01-02 ..
    # 2026-01-31, the 15th absent from the table.
    where = f"Iceberg table sales.card_transactions (snapshot {snapshot_id}, catalog lake)"
    assert f"{where} holds 300 row(s) in event_time >= '2026-01-31T00:00:00+00:00'" in output
    assert (
        "exported 2026-01-02T00:00:00+00:00 .. 2026-02-01T00:00:00+00:00 from sales.card_transactions "
        f"of catalog lake at snapshot {snapshot_id}" in output
    )

    home = Path(env["TRAINPIPE_HOME"])
    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    tags = client.get_model_version_by_alias("fraud_from_iceberg", "champion").tags
    assert tags["trainpipe.data_source"] == "iceberg:lake/sales.card_transactions"
    assert tags["trainpipe.data_snapshot_id"] == str(snapshot_id)
    assert tags["trainpipe.data_window"] == "2026-01-02T00:00:00+00:00 .. 2026-02-01T00:00:00+00:00"
    assert tags["trainpipe.data_filter"] == (
        "event_time >= '2026-01-02T00:00:00+00:00' AND event_time < '2026-02-01T00:00:00+00:00'"
    )
    manifest = json.loads(
        next((tmp_path / "records" / "_trainpipe" / "snapshots").glob("*.json")).read_text()
    )
    assert (
        manifest["digest"] == tags["trainpipe.data_digest"]
        and manifest["source"]["snapshot_id"] == snapshot_id
    )

    # A day is overwritten and every older snapshot expires, the files only they read deleted:
    # the snapshot trained on can no longer be read at the source, and the model is still
    # reproduced bit for bit from the frozen snapshot.
    iceberg_lake.write_days(table, [date(2026, 1, 20)], 300, seed=4)
    assert len(iceberg_lake.expire_snapshots(table)) == 1
    assert snapshot_id not in {s.snapshot_id for s in table.refresh().snapshots()}
    assert_reproduces("fraud_from_iceberg@champion", env)
