"""The `delta` source example's table: synthetic days (`synthetic.day_table`) with an `event_time`
inside each day and a `ds` date column the table is partitioned by, as a Spark or delta-rs loader
lays a Delta table out, written with delta-rs (no Spark, no server: `trainpipe make-data --delta
DIR`). A day written again replaces that day's partition in one commit (`predicate`), so the
table's earlier version still holds the old rows until a vacuum, as a warehouse correction does.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pyarrow as pa

from airflow_trainpipe.examples.synthetic import Problem, day_table, refuse_column_problems, with_event_time

PARTITION_COLUMN = "ds"


def write_day_delta(
    table_dir: Path,
    day: date,
    rows: int,
    seed: int = 0,
    problems: list[Problem] | tuple[Problem, ...] = (),
    kind: str = "card_transactions",
) -> int:
    """Replace one day's partition of the Delta table at `table_dir` (created when missing) with
    the rows `write_day` writes plus `event_time` and `ds`; returns the rows written."""
    from deltalake import write_deltalake

    refuse_column_problems(problems)
    table = with_event_time(day_table(day, rows, seed, problems, kind), day)
    table = table.append_column(PARTITION_COLUMN, pa.array([day] * table.num_rows, pa.date32()))
    table_dir.mkdir(parents=True, exist_ok=True)
    if (table_dir / "_delta_log").is_dir():  # the day's partition replaced, the others kept
        predicate = f"{PARTITION_COLUMN} = '{day.isoformat()}'"
        write_deltalake(
            str(table_dir), table, partition_by=[PARTITION_COLUMN], mode="overwrite", predicate=predicate
        )
    else:
        write_deltalake(str(table_dir), table, partition_by=[PARTITION_COLUMN], mode="append")
    return table.num_rows


def days_held(table_dir: Path) -> set[date]:
    """The days (partitions) the table holds at its current version; none when it does not exist."""
    if not (table_dir / "_delta_log").is_dir():
        return set()
    from deltalake import DeltaTable

    return {date.fromisoformat(p[PARTITION_COLUMN]) for p in DeltaTable(str(table_dir)).partitions()}
