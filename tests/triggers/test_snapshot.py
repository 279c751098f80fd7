"""DataSnapshotTrigger: survives the serialize round-trip the triggerer does, and fires on completion."""

from __future__ import annotations

import asyncio
from datetime import date
from pathlib import Path

from airflow.sdk.module_loading import import_string

from airflow_trainpipe.examples.synthetic import write_day
from airflow_trainpipe.triggers.snapshot import DataSnapshotTrigger


def _trigger(uri: str, **overrides: object) -> DataSnapshotTrigger:
    kwargs = {
        "uri": uri,
        "format": "parquet",
        "marker": "_SUCCESS",
        "min_rows": 100,
        "conn_id": None,
        "poke_interval": 0.2,
    }
    return DataSnapshotTrigger(**{**kwargs, **overrides})  # type: ignore[arg-type]


def test_serialize_round_trip(tmp_path: Path) -> None:
    trigger = _trigger(f"{tmp_path.as_uri()}/ds=2026-01-02", conn_id="aws_default")
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_trainpipe.triggers.snapshot.DataSnapshotTrigger"
    rebuilt = import_string(classpath)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs == {
        "uri": f"{tmp_path.as_uri()}/ds=2026-01-02",
        "format": "parquet",
        "marker": "_SUCCESS",
        "min_rows": 100,
        "conn_id": "aws_default",
        "poke_interval": 0.2,
    }


def test_fires_once_the_partition_is_complete(tmp_path: Path) -> None:
    uri = f"{tmp_path.as_uri()}/ds=2026-01-02"

    async def scenario() -> dict[str, object]:
        events = _trigger(uri).run()
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

    async def first_event() -> dict[str, object]:
        return (await _trigger(f"{tmp_path.as_uri()}/ds=2026-01-02").run().__anext__()).payload

    payload = asyncio.run(first_event())
    assert payload["status"] == "error" and "ArrowInvalid" in str(payload["message"])
