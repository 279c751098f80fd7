"""IcebergRowsTrigger on a real Iceberg table (a SQL catalog through Airflow's Iceberg hook):
fires on enough rows in the window, keeps waiting while the catalog is unreachable, ends the wait
at once on a table that does not exist."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from airflow_trainpipe.triggers.iceberg import IcebergRowsTrigger
from tests.helpers import iceberg_lake
from tests.helpers.triggers import first_event

START, END = "2026-01-02T00:00:00+00:00", "2026-01-03T00:00:00+00:00"


def _trigger(min_rows: int, **source: object) -> IcebergRowsTrigger:
    fields = {
        "kind": "iceberg",
        "conn_id": iceberg_lake.CONN_ID,
        "table": iceberg_lake.TABLE,
        "time_column": "event_time",
        "order_by": ["transaction_id"],
        **source,
    }
    return IcebergRowsTrigger(
        source=fields, window_start=START, window_end=END, min_rows=min_rows, poke_interval=0.1
    )


def test_fires_once_the_window_holds_enough_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = iceberg_lake.table(tmp_path, monkeypatch)
    iceberg_lake.write_days(table, [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)], 20)
    snapshot = table.refresh().current_snapshot().snapshot_id
    event = first_event(_trigger(20), 20)
    assert event is not None and event["status"] == "ready"
    assert event["message"].startswith(
        f"Iceberg table sales.card_transactions (snapshot {snapshot}, catalog lake) holds 20 row(s) in "
        "event_time >= '2026-01-02T00:00:00+00:00'"
    )
    assert first_event(_trigger(21), 1.0) is None
    missing = _trigger(1, table="sales.nowhere")
    event = first_event(missing, 20)
    assert event is not None and event["status"] == "error" and "it does not exist" in event["message"]
    kind, kwargs = missing.serialize()
    assert kind == "airflow_trainpipe.triggers.iceberg.IcebergRowsTrigger"
    assert IcebergRowsTrigger(**json.loads(json.dumps(kwargs))).source["table"] == "sales.nowhere"


def test_an_unreachable_catalog_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import free_port

    rest = {"conn_type": "iceberg", "host": f"http://127.0.0.1:{free_port()}", "extra": {}}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_DOWN", json.dumps(rest))
    assert first_event(_trigger(1, conn_id="lake_down"), 1.5) is None  # no error event: it keeps waiting
