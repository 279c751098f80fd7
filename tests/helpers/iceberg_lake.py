"""Iceberg tables of card transactions for the tests: a SQL catalog on SQLite in a test's folder
(`synthetic_iceberg`'s, as `trainpipe make-data --iceberg` makes it), the Airflow connection that
opens it through Airflow's Iceberg hook, and the warehouse's rows (`warehouse.day_rows`, an
`event_time` inside each day) in a table partitioned by `day(event_time)`, written a day per
commit as a loader would."""

from __future__ import annotations

import random
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_trainpipe.examples.iceberg_table import connection, ensure_table, open_catalog, replace_days
from tests.helpers.source_configs import source_config
from tests.helpers.warehouse import COLUMNS, day_rows

CONN_ID = "lake"
TABLE = "sales.card_transactions"


def catalog(folder: Path, monkeypatch: Any = None, conn_id: str = CONN_ID) -> Any:
    """The SQL catalog under `folder`, named after its Airflow connection (the hook's name for
    it); with `monkeypatch`, the connection `conn_id` defined in the environment."""
    if monkeypatch is not None:
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection(folder))
    return open_catalog(folder, conn_id)


def table(folder: Path, monkeypatch: Any = None, identifier: str = TABLE, conn_id: str = CONN_ID) -> Any:
    """The card transactions table of the catalog under `folder`, partitioned by day(event_time)."""
    return ensure_table(
        catalog(folder, monkeypatch, conn_id), identifier, day_rows(date(2026, 1, 1), 1, 0).schema
    )


def write_days(lake: Any, days: list[date], rows: int, seed: int = 0, shuffle: int | None = None) -> None:
    """One commit per day, replacing the day's rows (the newest first when `shuffle` is set, each
    day's rows shuffled with that seed and written as two files): the same rows as other files
    in another commit order."""
    order = list(reversed(days)) if shuffle is not None else days
    for day in order:
        rows_table = day_rows(day, rows, seed)
        if shuffle is None:
            replace_days(lake, {day: [rows_table]})
            continue
        indices = list(range(rows))
        random.Random(shuffle).shuffle(indices)
        shuffled = rows_table.take(pa.array(indices))
        replace_days(lake, {day: [shuffled.slice(0, rows // 3), shuffled.slice(rows // 3)]})


def iceberg_config(
    folder: Path, conn_id: str = CONN_ID, table: str = TABLE, partitions: int | None = None, **source: Any
) -> Path:
    """The demo's fraud_detector config reading the Iceberg table `table` of connection `conn_id`
    instead of files, its records, snapshots and checkpoints under `folder`."""
    columns = [c.strip() for c in COLUMNS.split(",")]
    table_source = {"kind": "iceberg", "conn_id": conn_id, "table": table, "time_column": "event_time"}
    table_source |= {"order_by": ["transaction_id"], "columns": columns}
    return source_config(folder, {**table_source, **source}, "iceberg", partitions)


def expire_snapshots(lake: Any) -> list[Path]:
    """What a table's maintenance job does (Spark's `expire_snapshots`): every snapshot but the
    current one expired, and the data files only they read deleted (pyiceberg 0.12 expires them
    from the metadata only). Returns the files deleted."""
    from airflow_trainpipe.core.storage import local_path

    lake = lake.refresh()
    current = lake.current_snapshot().snapshot_id
    kept = {local_path(task.file.file_path) for task in lake.scan().plan_files()}
    lake.maintenance.expire_snapshots().by_ids(
        [s.snapshot_id for s in lake.snapshots() if s.snapshot_id != current]
    ).commit()
    removed = [p for p in (local_path(lake.location()) / "data").rglob("*.parquet") if p not in kept]
    for path in removed:
        path.unlink()
    return removed
