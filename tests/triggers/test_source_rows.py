"""SourceRowsTrigger on every source kind, against the real stores: it survives the serialize
round-trip the triggerer does, fires once the rows are there, keeps waiting while the store is
unreachable, and ends the wait at once (the task reports it) on a check that cannot succeed."""

from __future__ import annotations

import asyncio
import json
from datetime import date
from pathlib import Path

import pytest
from airflow.sdk.module_loading import import_string

from airflow_trainpipe.examples.synthetic import write_day
from airflow_trainpipe.triggers.source_rows import SourceRowsTrigger
from tests.helpers import iceberg_lake, lake, warehouse
from tests.helpers.triggers import first_event

CLASSPATH = "airflow_trainpipe.triggers.source_rows.SourceRowsTrigger"
START, END = "2026-01-02T00:00:00+00:00", "2026-01-03T00:00:00+00:00"


# files ---------------------------------------------------------------------------------------


def _files(uri: str, **overrides: object) -> SourceRowsTrigger:
    wait = {"uri": uri, "format": "parquet", "marker": "_SUCCESS", "min_rows": 100, "conn_id": None}
    return SourceRowsTrigger(kind="files", wait={**wait, **overrides}, poke_interval=0.2)


def test_serialize_round_trip(tmp_path: Path) -> None:
    trigger = _files(f"{tmp_path.as_uri()}/ds=2026-01-02", conn_id="aws_default")
    classpath, kwargs = trigger.serialize()
    assert classpath == CLASSPATH
    rebuilt = import_string(classpath)(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs == {
        "kind": "files",
        "wait": {
            "uri": f"{tmp_path.as_uri()}/ds=2026-01-02",
            "format": "parquet",
            "marker": "_SUCCESS",
            "min_rows": 100,
            "conn_id": "aws_default",
        },
        "poke_interval": 0.2,
    }


def test_fires_once_the_partition_is_complete(tmp_path: Path) -> None:
    uri = f"{tmp_path.as_uri()}/ds=2026-01-02"

    async def scenario() -> dict[str, object]:
        events = _files(uri).run()
        pending = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0.5)
        assert not pending.done()  # nothing there yet: still waiting
        await asyncio.to_thread(write_day, tmp_path.as_uri(), date(2026, 1, 2), 150, seed=1)
        event = await asyncio.wait_for(pending, timeout=10)
        return event.payload

    assert asyncio.run(scenario()) == {"status": "ready", "message": f"{uri} holds 150 row(s) in 1 file(s)"}


def test_a_failing_check_is_reported_to_the_task(tmp_path: Path) -> None:
    partition = tmp_path / "ds=2026-01-02"
    partition.mkdir()
    (partition / "part-00000.parquet").write_bytes(b"not parquet")  # a truncated upload
    (partition / "_SUCCESS").write_bytes(b"")

    async def first() -> dict[str, object]:
        return (await _files(f"{tmp_path.as_uri()}/ds=2026-01-02").run().__anext__()).payload

    payload = asyncio.run(first())
    assert payload["status"] == "error" and "ArrowInvalid" in str(payload["message"])


def test_an_unknown_kind_ends_the_wait() -> None:
    event = first_event(SourceRowsTrigger(kind="kafka", wait={}, poke_interval=0.1), 5)
    assert event == {"status": "error", "message": "SourceError: unknown source kind 'kafka'"}


# sql -----------------------------------------------------------------------------------------


def _sql(conn_id: str, query: str, min_rows: int) -> SourceRowsTrigger:
    wait = {"conn_id": conn_id, "query": query, "min_rows": min_rows}
    return SourceRowsTrigger(kind="sql", wait=wait, poke_interval=0.1)


def test_sql_fires_once_the_query_returns_enough_rows(
    postgres_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = warehouse.create_database(postgres_server.url, "trigger_tests")
    warehouse.load_days(url, [date(2026, 1, 2)], 20)
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", url)
    query = "SELECT * FROM card_transactions"
    assert first_event(_sql("warehouse", query, 20), 20) == {
        "status": "ready",
        "message": "the query on 'warehouse' returns 20 row(s)",
    }
    assert first_event(_sql("warehouse", query, 21), 1.0) is None
    refused = _sql("warehouse", "SELECT * FROM nope", 1)
    event = first_event(refused, 20)
    assert (
        event is not None
        and event["status"] == "error"
        and 'relation "nope" does not exist' in event["message"]
    )
    classpath, kwargs = refused.serialize()
    assert classpath == CLASSPATH and SourceRowsTrigger(**kwargs).wait["query"] == "SELECT * FROM nope"


def test_sql_an_unreachable_database_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import free_port

    monkeypatch.setenv("AIRFLOW_CONN_DOWN", f"postgres://postgres@127.0.0.1:{free_port()}/postgres")
    assert first_event(_sql("down", "SELECT 1", 1), 1.5) is None  # no error event: it keeps waiting


# delta ---------------------------------------------------------------------------------------


def _delta(uri: str, min_rows: int, **source: object) -> SourceRowsTrigger:
    fields = {
        "kind": "delta",
        "uri": uri,
        "time_column": "event_time",
        "order_by": ["transaction_id"],
        **source,
    }
    wait = {"source": fields, "window_start": START, "window_end": END, "min_rows": min_rows}
    return SourceRowsTrigger(kind="delta", wait=wait, poke_interval=0.1)


def test_delta_fires_once_the_window_holds_enough_rows(tmp_path: Path) -> None:
    table = tmp_path / "transactions"
    lake.write_days(table, [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)], 20)
    event = first_event(_delta(table.as_uri(), 20), 20)
    assert event is not None and event["status"] == "ready"
    assert event["message"].startswith(f"{table.as_uri()} (version 2) holds 20 row(s) in ")
    assert first_event(_delta(table.as_uri(), 21), 1.0) is None
    missing = _delta((tmp_path / "nowhere").as_uri(), 1)
    event = first_event(missing, 20)
    assert event is not None and event["status"] == "error" and "no Delta table at" in event["message"]
    classpath, kwargs = missing.serialize()
    assert classpath == CLASSPATH
    rebuilt = SourceRowsTrigger(**json.loads(json.dumps(kwargs)))
    assert rebuilt.wait["source"]["uri"] == (tmp_path / "nowhere").as_uri()


def test_delta_unreachable_storage_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import free_port

    extra = {"region_name": "us-east-1", "endpoint_url": f"http://127.0.0.1:{free_port()}"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_DOWN",
        json.dumps({"conn_type": "aws", "login": "testing", "password": "testing", "extra": extra}),
    )
    trigger = _delta("s3://lake/transactions", 1, conn_id="lake_down")
    assert first_event(trigger, 6.0) is None  # no error event: it keeps waiting


# iceberg -------------------------------------------------------------------------------------


def _iceberg(min_rows: int, **source: object) -> SourceRowsTrigger:
    fields = {
        "kind": "iceberg",
        "conn_id": iceberg_lake.CONN_ID,
        "table": iceberg_lake.TABLE,
        "time_column": "event_time",
        "order_by": ["transaction_id"],
        **source,
    }
    wait = {"source": fields, "window_start": START, "window_end": END, "min_rows": min_rows}
    return SourceRowsTrigger(kind="iceberg", wait=wait, poke_interval=0.1)


def test_iceberg_fires_once_the_window_holds_enough_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = iceberg_lake.table(tmp_path, monkeypatch)
    iceberg_lake.write_days(table, [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)], 20)
    snapshot = table.refresh().current_snapshot().snapshot_id
    event = first_event(_iceberg(20), 20)
    assert event is not None and event["status"] == "ready"
    assert event["message"].startswith(
        f"Iceberg table sales.card_transactions (snapshot {snapshot}, catalog lake) holds 20 row(s) in "
        "event_time >= '2026-01-02T00:00:00+00:00'"
    )
    assert first_event(_iceberg(21), 1.0) is None
    missing = _iceberg(1, table="sales.nowhere")
    event = first_event(missing, 20)
    assert event is not None and event["status"] == "error" and "it does not exist" in event["message"]
    classpath, kwargs = missing.serialize()
    assert classpath == CLASSPATH
    assert SourceRowsTrigger(**json.loads(json.dumps(kwargs))).wait["source"]["table"] == "sales.nowhere"


def test_iceberg_an_unreachable_catalog_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import free_port

    rest = {"conn_type": "iceberg", "host": f"http://127.0.0.1:{free_port()}", "extra": {}}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_DOWN", json.dumps(rest))
    assert first_event(_iceberg(1, conn_id="lake_down"), 1.5) is None  # no error event: it keeps waiting
