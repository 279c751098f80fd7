"""A Delta Lake table of card transactions written by the tests with `deltalake.write_deltalake`:
the warehouse's rows (`warehouse.day_rows`, an `event_time` inside each day) plus a `ds` date
column the table is partitioned by, as a Spark or delta-rs loader would lay it out."""

from __future__ import annotations

import random
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.helpers.source_configs import source_config
from tests.helpers.warehouse import COLUMNS, day_rows


def day_table(day: date, rows: int, seed: int = 0) -> pa.Table:
    table = day_rows(day, rows, seed)
    return table.append_column("ds", pa.array([day] * rows, pa.date32()))


def write_days(
    uri: str | Path,
    days: list[date],
    rows: int,
    seed: int = 0,
    mode: str = "append",
    shuffle: int | None = None,
    partition_by: tuple[str, ...] = ("ds",),
) -> None:
    """One commit per day (the newest first when `shuffle` is set, each day's rows shuffled with
    that seed and written in two commits): the same rows as other files in another log order."""
    from deltalake import write_deltalake

    order = list(reversed(days)) if shuffle is not None else days
    for day in order:
        table = day_table(day, rows, seed)
        if shuffle is None:
            write_deltalake(str(uri), table, partition_by=list(partition_by), mode=mode)
            mode = "append"
            continue
        indices = list(range(rows))
        random.Random(shuffle).shuffle(indices)
        shuffled = table.take(pa.array(indices))
        for part in (shuffled.slice(0, rows // 3), shuffled.slice(rows // 3)):
            write_deltalake(str(uri), part, partition_by=list(partition_by), mode=mode)
            mode = "append"


def delta_config(folder: Path, table: str, partitions: int | None = None, **source: Any) -> Path:
    """The demo's fraud_detector config reading the Delta table `table` instead of files, its
    records, snapshots and checkpoints under `folder`."""
    columns = [c.strip() for c in COLUMNS.split(",")]
    table_source = {
        "kind": "delta",
        "uri": table,
        "time_column": "event_time",
        "order_by": ["transaction_id"],
    }
    return source_config(folder, {**table_source, "columns": columns, **source}, "delta", partitions)
