"""The `iceberg` source example's table: synthetic days (`synthetic.day_table`) with an
`event_time` inside each day, in an Iceberg table partitioned by `day(event_time)` (hidden
partitioning: no partition column in the rows) of a SQL catalog on SQLite with a local warehouse,
so no server is needed (`trainpipe make-data --iceberg DIR`).

A day is written as a Parquet file under the table's location and committed with `add_files`, in
one transaction with the delete of the day's earlier rows (whole files of its partition: nothing
is rewritten), so a day written again holds its new rows only. pyiceberg's `append` and
`overwrite` compute a `day` transform with pyiceberg-core (Rust), which is not a dependency here;
`add_files` reads each file's partition value from its column statistics instead.

Airflow's Iceberg hook names the catalog after the connection, and a SQL catalog keeps each
table under its catalog's name: the table is created under `conn_id`, the name of the connection
`trainpipe make-data` prints.
"""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from airflow_trainpipe.examples.synthetic import (
    TIME_COLUMN,
    Problem,
    day_table,
    refuse_column_problems,
    with_event_time,
)

LAKE_CONN_ID = "trainpipe_lake"
"""The connection dags/configs/fraud_detector_iceberg.yaml reads its table through."""
NAMESPACE = "trainpipe"


def catalog_properties(folder: Path) -> dict[str, str]:
    """A SQL catalog on `folder/catalog.db` (SQLite) with its warehouse in `folder/warehouse`."""
    folder = folder.resolve()
    return {
        "type": "sql",
        "uri": f"sqlite:///{folder / 'catalog.db'}",
        "warehouse": (folder / "warehouse").as_uri(),
    }


def connection(folder: Path) -> str:
    """The Airflow connection of the catalog, as an `AIRFLOW_CONN_*` value (Airflow's JSON form:
    the hook reads the catalog's properties from the extra)."""
    return json.dumps({"conn_type": "iceberg", "extra": catalog_properties(folder)})


def open_catalog(folder: Path, name: str = LAKE_CONN_ID) -> Any:
    """The SQL catalog (`pyiceberg.catalog.sql.SqlCatalog`), created with its folder if missing."""
    from pyiceberg.catalog.sql import SqlCatalog

    (folder / "warehouse").mkdir(parents=True, exist_ok=True)
    return SqlCatalog(name, **catalog_properties(folder))


def ensure_table(catalog: Any, identifier: str, schema: pa.Schema) -> Any:
    """The table, created partitioned by `day(event_time)` when the catalog lacks it."""
    from pyiceberg.transforms import DayTransform

    catalog.create_namespace_if_not_exists(identifier.rsplit(".", 1)[0])
    if catalog.table_exists(identifier):
        return catalog.load_table(identifier)
    created = catalog.create_table(identifier, schema=schema)  # field ids assigned to the Arrow schema
    with created.update_spec() as spec:
        spec.add_field(TIME_COLUMN, DayTransform(), f"{TIME_COLUMN}_day")
    return catalog.load_table(identifier)


def replace_days(table: Any, days: dict[date, Sequence[pa.Table]], time_column: str = TIME_COLUMN) -> None:
    """In one commit: each day's earlier rows (by `time_column`, the table's day partition)
    deleted, its new rows added as one Parquet file per table given (in that order)."""
    import pyarrow.parquet as pq

    paths = []
    for day, parts in days.items():
        for part in parts:
            path = f"{table.location()}/data/{time_column}_day={day.isoformat()}/{uuid.uuid4().hex}.parquet"
            with table.io.new_output(path).create(overwrite=False) as out:
                pq.write_table(part, out)
            paths.append(path)
    with table.transaction() as transaction, warnings.catch_warnings():
        # A day written for the first time has nothing to delete: pyiceberg warns, nothing is wrong.
        warnings.filterwarnings("ignore", "Delete operation did not match any records")
        for day in days:
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            end = start + timedelta(days=1)
            transaction.delete(
                f"{time_column} >= '{start.isoformat()}' AND {time_column} < '{end.isoformat()}'"
            )
        transaction.add_files(paths)


def write_day_iceberg(
    folder: Path,
    day: date,
    rows: int,
    seed: int = 0,
    problems: list[Problem] | tuple[Problem, ...] = (),
    kind: str = "card_transactions",
    conn_id: str = LAKE_CONN_ID,
) -> tuple[str, int]:
    """Replace one day's rows of table `trainpipe.<kind>` in the catalog under `folder` (created
    with the table when missing) with the rows `write_day` writes plus `event_time`; returns the
    table's identifier and the rows written."""
    refuse_column_problems(problems)
    rows_table = with_event_time(day_table(day, rows, seed, problems, kind), day)
    identifier = f"{NAMESPACE}.{kind}"
    table = ensure_table(open_catalog(folder, conn_id), identifier, rows_table.schema)
    replace_days(table, {day: [rows_table]})
    return identifier, rows_table.num_rows


def days_held(folder: Path, kind: str = "card_transactions", conn_id: str = LAKE_CONN_ID) -> set[date]:
    """The days whose rows the table `trainpipe.<kind>` holds at its current snapshot (none when
    the catalog or the table does not exist yet): read from the manifests, no data file opened."""
    if not (folder / "catalog.db").exists():
        return set()
    catalog = open_catalog(folder, conn_id)
    identifier = f"{NAMESPACE}.{kind}"
    if not catalog.table_exists(identifier):
        return set()
    epoch = date(1970, 1, 1)
    return {
        epoch + timedelta(days=task.file.partition[0])
        for task in catalog.load_table(identifier).scan().plan_files()
    }
