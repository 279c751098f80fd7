"""dags/configs/fraud_detector_delta.yaml as a user tries it: `trainpipe make-data --delta` writes
eight days into a Delta table under TRAINPIPE_HOME (no connection: a local table); the example's
source freezes the 7-day window ending 2026-01-07 from the table's current version, the columns
its schema contract expects, reading only the window's ds partitions. A day written again is a new
version, and the example freezes the new rows. (Training on a delta source through the factory's
five tasks: test_delta_source.py.)"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.cli import main as trainpipe
from airflow_trainpipe.config import load_config
from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.data.freeze import snapshot_for_date
from tests.conftest import EXAMPLE_CONFIGS

EXAMPLE = EXAMPLE_CONFIGS / "fraud_detector_delta.yaml"


def test_the_example_freezes_the_week_make_data_wrote_into_a_delta_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINPIPE_HOME", str(home))
    config = load_config(EXAMPLE)
    assert config.data.source.kind == "delta"
    table = home / config.data.source.uri  # relative to TRAINPIPE_HOME, as the comment says
    days = ["--start", "2026-01-01", "--days", "8", "--rows", "1000"]  # the example waits for 1000
    assert trainpipe(["make-data", "--delta", str(table), *days]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{table} ds=2026-01-08: 1000 row(s), clean"

    manifest = snapshot_for_date(config, "2026-01-07")  # the run's day and the 6 before it
    assert manifest.rows == 7_000 and manifest.source is not None
    assert (manifest.source.window_start, manifest.source.window_end) == (
        "2026-01-01T00:00:00+00:00",
        "2026-01-08T00:00:00+00:00",
    )
    assert manifest.source.table == table.as_uri() and manifest.source.version == 7  # 8 commits
    assert manifest.columns == config.validation.contract.columns  # the example's schema contract
    frozen = [local_path(f.uri) for f in manifest.files]
    assert all(path.is_relative_to(home / "snapshots") for path in frozen)  # relative to TRAINPIPE_HOME
    assert pq.read_table(frozen[0]).column("transaction_id")[0].as_py().startswith("20260101-")

    # A day written again replaces its partition in a new version; the window freezes the new rows.
    assert trainpipe(["make-data", "--delta", str(table), "--start", "2026-01-03", "--rows", "400"]) == 0
    again = snapshot_for_date(config, "2026-01-07")
    assert again.rows == 6_400 and again.source is not None and again.source.version == 8
    assert again.digest != manifest.digest


def test_make_data_refuses_what_a_table_cannot_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "t"
    assert trainpipe(["make-data", "--delta", str(table), "--problem", "2026-01-01=drop:amount"]) == 2
    assert "a table's columns are fixed" in capsys.readouterr().err
    assert trainpipe(["make-data", "--delta", str(table), "--files", "2"]) == 2
    assert "a Delta day is one commit" in capsys.readouterr().err
