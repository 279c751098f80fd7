"""dags/configs/fraud_detector_iceberg.yaml as a user tries it: `trainpipe make-data --iceberg`
writes eight days into an Iceberg table of a SQL catalog on SQLite and prints the connection to
export; with it, the example's source freezes the 7-day window ending 2026-01-07, the columns
its schema contract expects. (Training on an iceberg source through the factory's five tasks:
test_iceberg_source.py.) `make up` defines the same connection over its own catalog."""

from __future__ import annotations

import shlex
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.cli import main as trainpipe
from airflow_trainpipe.config import load_config
from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.data.freeze import snapshot_for_date
from airflow_trainpipe.examples.iceberg_table import LAKE_CONN_ID, connection
from tests.conftest import EXAMPLE_CONFIGS
from tests.integration.conftest import load_up

EXAMPLE = EXAMPLE_CONFIGS / "fraud_detector_iceberg.yaml"


def test_make_up_defines_the_connection_the_example_reads(tmp_path: Path) -> None:
    source = load_config(EXAMPLE).data.source
    assert source.kind == "iceberg" and source.conn_id == LAKE_CONN_ID
    home = tmp_path / "home"
    env = load_up().airflow_env(tmp_path / "airflow", tmp_path / "dags", tmp_path, home, 8080, "{}")
    assert env[f"AIRFLOW_CONN_{LAKE_CONN_ID.upper()}"] == connection(home / "lake")


def test_the_example_freezes_the_week_make_data_wrote_into_an_iceberg_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINPIPE_HOME", str(home))
    days = ["--start", "2026-01-01", "--days", "8", "--rows", "1000"]  # the example waits for 1000
    assert trainpipe(["make-data", "--iceberg", str(home / "lake"), *days]) == 0
    # What a user pastes into the shell: `export AIRFLOW_CONN_...=...`, its value shell-quoted.
    name, _, value = capsys.readouterr().out.splitlines()[-1].removeprefix("export ").partition("=")
    assert name == "AIRFLOW_CONN_TRAINPIPE_LAKE"
    (quoted,) = shlex.split(value)
    monkeypatch.setenv(name, quoted)

    config = load_config(EXAMPLE)
    manifest = snapshot_for_date(config, "2026-01-07")  # the run's day and the 6 before it
    assert manifest.rows == 7_000 and manifest.source is not None
    assert (manifest.source.window_start, manifest.source.window_end) == (
        "2026-01-01T00:00:00+00:00",
        "2026-01-08T00:00:00+00:00",
    )
    assert manifest.source.table == "trainpipe.card_transactions" and manifest.source.snapshot_id
    assert manifest.columns == config.validation.contract.columns  # the example's schema contract
    frozen = [local_path(f.uri) for f in manifest.files]
    assert all(path.is_relative_to(home / "snapshots") for path in frozen)  # relative to TRAINPIPE_HOME
    assert pq.read_table(frozen[0]).column("transaction_id")[0].as_py().startswith("20260101-")
