"""A warehouse table on the throwaway PostgreSQL cluster: card transactions with an event time.

The rows are `synthetic.transactions` (the demo's), one day at a time, each with an `event_time`
inside its day, loaded with ADBC's bulk ingest (COPY), as a warehouse loader would.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import adbc_driver_postgresql.dbapi as adbc_pg
import pyarrow as pa

from airflow_trainpipe.examples.synthetic import transactions
from tests.helpers.source_configs import source_config

COLUMNS = (
    "transaction_id, amount, hour, merchant_risk, distance_from_home_km, account_age_days, "
    "txn_count_24h, channel, country, is_fraud"
)


def adbc_uri(url: str) -> str:
    return url.replace("postgres://", "postgresql://", 1)


def create_database(url: str, name: str) -> str:
    """A fresh database on the cluster; the connection URI (Airflow's postgres:// form) of it."""
    with adbc_pg.connect(adbc_uri(url), autocommit=True) as db, db.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cursor.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + f"/{name}"


def day_rows(day: date, rows: int, seed: int) -> pa.Table:
    table = transactions(day, rows, seed)
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    times = [start + timedelta(seconds=(86_400 * i) // rows) for i in range(rows)]
    return table.append_column("event_time", pa.array(times, pa.timestamp("us", tz="UTC")))


def load_days(url: str, days: list[date], rows: int, seed: int = 0, table: str = "card_transactions") -> None:
    with adbc_pg.connect(adbc_uri(url)) as db, db.cursor() as cursor:
        for day in days:
            cursor.adbc_ingest(table, day_rows(day, rows, seed), mode="create_append")
        db.commit()


def execute(url: str, *statements: str) -> None:
    with adbc_pg.connect(adbc_uri(url)) as db, db.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
        db.commit()


WINDOW_QUERY = (
    f"SELECT {COLUMNS} FROM card_transactions "
    "WHERE event_time >= {{ window_start }} AND event_time < {{ window_end }}"
)


def sql_config(folder: Path, conn_id: str = "warehouse", partitions: int | None = None, **data: Any) -> Path:
    """The demo's fraud_detector config reading `card_transactions` from a connection instead of
    files, its records, snapshots and checkpoints under `folder`."""
    source = {"kind": "sql", "conn_id": conn_id, "query": WINDOW_QUERY, "order_by": ["transaction_id"]}
    return source_config(folder, source, f"sql_{conn_id}", partitions, **data)
