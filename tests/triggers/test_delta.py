"""DeltaRowsTrigger on a real Delta table: fires on enough rows in the window, keeps waiting while
the storage is unreachable, ends the wait at once on a table that does not exist."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from airflow_trainpipe.triggers.delta import DeltaRowsTrigger
from tests.helpers import lake
from tests.helpers.triggers import first_event

START, END = "2026-01-02T00:00:00+00:00", "2026-01-03T00:00:00+00:00"


def _trigger(uri: str, min_rows: int, **source: object) -> DeltaRowsTrigger:
    fields = {
        "kind": "delta",
        "uri": uri,
        "time_column": "event_time",
        "order_by": ["transaction_id"],
        **source,
    }
    return DeltaRowsTrigger(
        source=fields, window_start=START, window_end=END, min_rows=min_rows, poke_interval=0.1
    )


def test_fires_once_the_window_holds_enough_rows(tmp_path: Path) -> None:
    table = tmp_path / "transactions"
    lake.write_days(table, [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)], 20)
    event = first_event(_trigger(table.as_uri(), 20), 20)
    assert event is not None and event["status"] == "ready"
    assert event["message"].startswith(f"{table.as_uri()} (version 2) holds 20 row(s) in ")
    assert first_event(_trigger(table.as_uri(), 21), 1.0) is None
    missing = _trigger((tmp_path / "nowhere").as_uri(), 1)
    event = first_event(missing, 20)
    assert event is not None and event["status"] == "error" and "no Delta table at" in event["message"]
    kind, kwargs = missing.serialize()
    assert kind == "airflow_trainpipe.triggers.delta.DeltaRowsTrigger"
    assert DeltaRowsTrigger(**json.loads(json.dumps(kwargs))).source["uri"] == (tmp_path / "nowhere").as_uri()


def test_unreachable_storage_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import free_port

    extra = {"region_name": "us-east-1", "endpoint_url": f"http://127.0.0.1:{free_port()}"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_DOWN",
        json.dumps({"conn_type": "aws", "login": "testing", "password": "testing", "extra": extra}),
    )
    trigger = _trigger("s3://lake/transactions", 1, conn_id="lake_down")
    assert first_event(trigger, 6.0) is None  # no error event: it keeps waiting
