"""A pipeline whose rows come from a Delta Lake table: the factory's five tasks through Airflow's
own dag.test() on a 30-day window of a table partitioned by day, then the table is overwritten and
vacuumed (the version trained on is gone) and `trainpipe reproduce` still trains the identical
model from the frozen snapshot."""

from __future__ import annotations

import json
from datetime import date, timedelta
from pathlib import Path

import pytest
import yaml

from tests.helpers import lake
from tests.helpers.airflow_dags import FACTORY_TASKS, run_factory_pipeline
from tests.helpers.source_configs import assert_reproduces


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_30_day_window_from_delta_trains_registers_and_reproduces_after_a_vacuum(
    airflow_env: dict[str, str], tmp_path: Path
) -> None:
    from deltalake import DeltaTable
    from mlflow import MlflowClient

    table = tmp_path / "lake" / "card_transactions"
    days = [date(2026, 1, 1) + timedelta(days=d) for d in range(31)]
    lake.write_days(table, [d for d in days if d != date(2026, 1, 15)], 300, seed=3)
    version = DeltaTable(str(table)).version()
    env = dict(airflow_env)
    config = yaml.safe_load(lake.delta_config(tmp_path, table.as_uri(), partitions=30).read_text())
    run, output = run_factory_pipeline(env, {**config, "pipeline": "fraud_from_delta"}, "2026-01-31")
    assert run["tasks"] == dict.fromkeys(FACTORY_TASKS, "success"), output[-8000:]
    # The sensor counts the run's own day; the window is 30 days ending with it: 2026-01-02 ..
    # 2026-01-31, the 15th absent from the table.
    assert f"{table.as_uri()} (version {version}) holds 300 row(s) in " in output
    assert (
        f"exported 2026-01-02T00:00:00+00:00 .. 2026-02-01T00:00:00+00:00 from {table.as_uri()} at version {version}"
        in output
    )

    home = Path(env["TRAINPIPE_HOME"])
    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    tags = client.get_model_version_by_alias("fraud_from_delta", "champion").tags
    assert tags["trainpipe.data_source"] == f"delta:{table.as_uri()}"
    assert tags["trainpipe.data_table_version"] == str(version)
    assert tags["trainpipe.data_window"] == "2026-01-02T00:00:00+00:00 .. 2026-02-01T00:00:00+00:00"
    assert tags["trainpipe.data_filter"].startswith("((event_time >= 2026-01-02 00:00:00.000000Z) and ")
    manifest = next((tmp_path / "records" / "_trainpipe" / "snapshots").glob("*.json"))
    assert json.loads(manifest.read_text())["digest"] == tags["trainpipe.data_digest"]

    # The table is rewritten and vacuumed: the version trained on can no longer be read at the
    # source, and the model is still reproduced bit for bit from the frozen snapshot.
    lake.write_days(table, days[10:20], 300, seed=4, mode="overwrite")
    removed = DeltaTable(str(table)).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    assert len(removed) == 30
    assert_reproduces("fraud_from_delta@champion", env)
