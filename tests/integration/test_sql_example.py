"""dags/configs/fraud_detector_sql.yaml as a user tries it: `trainpipe make-data --sqlite` writes
seven days into an SQLite file and prints the connection to export; the repository's loader file
builds the example's DAG, and Airflow's own dag.test() runs it on the 7-day window."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_trainpipe.config import load_config
from airflow_trainpipe.examples.synthetic import WAREHOUSE_CONN_ID, sqlite_connection_uri
from tests.conftest import EXAMPLE_CONFIGS, REPO_ROOT
from tests.helpers.airflow_dags import dag_test_env, run_dag_file
from tests.integration.conftest import load_up

EXAMPLE = EXAMPLE_CONFIGS / "fraud_detector_sql.yaml"
TASKS = ["wait_for_data", "validate_data", "train", "gate", "register"]


def test_make_up_defines_the_connection_the_example_reads(tmp_path: Path) -> None:
    source = load_config(EXAMPLE).data.source
    assert source.kind == "sql" and source.conn_id == WAREHOUSE_CONN_ID
    home = tmp_path / "home"
    env = load_up().airflow_env(tmp_path / "airflow", tmp_path / "dags", tmp_path, home, 8080, "{}")
    assert env[f"AIRFLOW_CONN_{WAREHOUSE_CONN_ID.upper()}"] == sqlite_connection_uri(home / "warehouse.db")


def _example(epochs: int, min_value: float) -> str:
    """The example as shipped, but short: one epoch, and any first model promoted."""
    text = EXAMPLE.read_text()
    for old, new in (("epochs: 3", f"epochs: {epochs}"), ("min_value: 0.7", f"min_value: {min_value}")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_sql_example_trains_on_a_week_that_make_data_wrote_into_sqlite(
    migrated_airflow_db: Path, migrated_mlflow_db: Path, tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    env = dag_test_env(tmp_path, migrated_airflow_db, migrated_mlflow=migrated_mlflow_db)
    env.pop("AIRFLOW_CONN_MLFLOW_DEFAULT", None)  # the embedded store under TRAINPIPE_HOME
    home = Path(env["TRAINPIPE_HOME"])
    database = home / "warehouse.db"
    days = ["--start", "2026-01-01", "--days", "8", "--rows", "1000"]  # the example waits for 1000
    made = subprocess.run(
        [sys.executable, "-m", "airflow_trainpipe.cli", "make-data", "--sqlite", str(database), *days],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    # What a user pastes into the shell: `export AIRFLOW_CONN_...=...`, its value shell-quoted.
    name, _, value = made.stdout.splitlines()[-1].removeprefix("export ").partition("=")
    (env[name],) = shlex.split(value)
    assert name == "AIRFLOW_CONN_TRAINPIPE_WAREHOUSE"

    dags = Path(env["AIRFLOW__CORE__DAGS_FOLDER"])
    (dags / "configs").mkdir()
    (dags / "configs" / EXAMPLE.name).write_text(_example(epochs=1, min_value=0.0))
    loader = (REPO_ROOT / "dags" / "trainpipe_pipelines.py").read_text()
    run = run_dag_file(
        env,
        "trainpipe_pipelines",
        loader + '\ndag = globals()["fraud_detector_sql"]\n',
        logical_date="2026-01-07",
        timeout=540,
    )
    assert (run.state, run.tasks) == ("success", dict.fromkeys(TASKS, "success")), run.output[-8000:]
    # The sensor counts the run's own day; the window is that day and the 6 before it (2026-01-08
    # is in the table, not in the run).
    assert "the query on 'trainpipe_warehouse' returns 1000 row(s)" in run.output
    window = "2026-01-01T00:00:00+00:00 .. 2026-01-08T00:00:00+00:00"
    assert f"exported {window} from trainpipe_warehouse" in run.output

    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    version = client.get_model_version_by_alias("fraud_detector_sql", "champion")
    assert version.tags["trainpipe.data_source"] == "sql:trainpipe_warehouse"
    assert version.tags["trainpipe.data_window"] == window
    frozen = list((home / "snapshots" / "sha256").glob("*/*.parquet"))
    assert len(frozen) == 1  # 7000 rows: one file of the store, relative to TRAINPIPE_HOME
