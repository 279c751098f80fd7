"""The sql source on a real PostgreSQL (a throwaway cluster) and a real SQLite file: the export's
bytes, its order and row groups, the window, and every bad input named, retried only when a retry
can help."""

from __future__ import annotations

import hashlib
import sqlite3
from datetime import UTC, date, datetime
from pathlib import Path
from urllib.parse import quote

import psycopg
import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.config.sources import SqlSource
from airflow_trainpipe.config.templates import date_context
from airflow_trainpipe.data.sources import sql
from airflow_trainpipe.data.window import run_time_window
from tests.helpers import warehouse

DAYS = [date(2026, 1, d) for d in range(1, 5)]
ROWS_PER_DAY = 2_500
QUERY = f"SELECT {warehouse.COLUMNS} FROM card_transactions"


@pytest.fixture(scope="module")
def warehouse_url(postgres_server) -> str:
    url = warehouse.create_database(postgres_server.url, "sql_source_tests")
    warehouse.load_days(url, DAYS, ROWS_PER_DAY)
    return url


@pytest.fixture
def wh(warehouse_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", warehouse_url)
    return "warehouse"


def _source(**overrides: object) -> SqlSource:
    fields = {"kind": "sql", "conn_id": "warehouse", "query": QUERY, "order_by": ["transaction_id"]}
    return SqlSource.model_validate({**fields, **overrides})


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_same_rows_give_the_same_files_in_key_order_and_whole_row_groups(wh: str, tmp_path: Path) -> None:
    source = _source(batch_rows=1_000, file_rows=2_500)  # files round up to whole row groups: 3,000 rows
    runs = []
    for attempt in ("a", "b"):
        folder = tmp_path / attempt
        folder.mkdir()
        runs.append(sql.export(source, QUERY, folder))
    (files, schema), (again, _) = runs
    assert [f.rows for f in files] == [3_000, 3_000, 3_000, 1_000]
    assert [_sha(f.path) for f in files] == [_sha(f.path) for f in again]
    groups = [
        pq.ParquetFile(f.path).metadata.row_group(g).num_rows
        for f in files
        for g in range(3 if f.rows == 3_000 else 1)
    ]
    assert set(groups) == {1_000}
    ids = [i for f in files for i in pq.read_table(f.path, columns=["transaction_id"]).column(0).to_pylist()]
    assert ids == sorted(ids) and len(ids) == len(DAYS) * ROWS_PER_DAY
    assert schema.names == [c.strip() for c in warehouse.COLUMNS.split(",")]
    assert str(schema.field("hour").type) == "int64" and str(schema.field("amount").type) == "double"


def test_a_key_that_does_not_order_every_row_fails_naming_the_tie(wh: str, tmp_path: Path) -> None:
    with pytest.raises(
        sql.SourceError,
        match=r"does not order the rows completely: rows \d+ and \d+ of the result both have \{'channel': 'atm'\}",
    ) as caught:
        sql.export(_source(order_by=["channel"]), QUERY, tmp_path)
    assert caught.value.retryable is False


@pytest.mark.parametrize("batch_rows", [65_536, 2], ids=["within a batch", "across batches"])
def test_nan_keys_tie_like_repeated_values(wh: str, tmp_path: Path, batch_rows: int) -> None:
    # PostgreSQL sorts NaN after every number and NaNs together, in no defined order among them.
    query = "SELECT * FROM (VALUES (1.0::float8, 'a'), ('NaN'::float8, 'b'), ('NaN'::float8, 'c')) AS t(k, v)"
    with pytest.raises(sql.SourceError, match=r"rows 1 and 2 of the result both have \{'k': nan\}"):
        sql.export(_source(query=query, order_by=["k"], batch_rows=batch_rows), query, tmp_path)
    unique = query.replace("'NaN'::float8, 'c'", "2.0::float8, 'c'")
    (tmp_path / "ok").mkdir()
    files, _ = sql.export(
        _source(query=unique, order_by=["k"], batch_rows=batch_rows), unique, tmp_path / "ok"
    )
    assert pq.read_table(files[0].path).column("v").to_pylist() == ["a", "c", "b"]


@pytest.mark.parametrize(
    ("query", "order_by", "message"),
    [
        ("SELECT * FROM no_such_table", ["transaction_id"], 'relation "no_such_table" does not exist'),
        (
            "SELECT no_such_column FROM card_transactions",
            ["transaction_id"],
            'column "no_such_column" does not exist',
        ),
        ("SELEC 1", ["transaction_id"], "syntax error"),
        (f"{QUERY} WHERE amount < 0", ["transaction_id"], "returned no rows for the run's window"),
        (
            "SELECT amount FROM card_transactions",
            ["transaction_id"],
            'column "transaction_id" does not exist',
        ),
    ],
    ids=["missing table", "missing column", "syntax", "no rows", "key not returned"],
)
def test_a_query_the_database_refuses_is_named_and_not_retried(
    wh: str, tmp_path: Path, query: str, order_by: list[str], message: str
) -> None:
    with pytest.raises(sql.SourceError, match=message) as caught:
        sql.export(_source(order_by=order_by), query, tmp_path)
    assert caught.value.retryable is False and "warehouse" in str(caught.value)


def test_a_connection_that_is_not_defined_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_NOWHERE", raising=False)
    with pytest.raises(sql.SourceError, match="Airflow connection 'nowhere' is not defined") as caught:
        sql.export(_source(conn_id="nowhere"), QUERY, tmp_path)
    assert caught.value.retryable is False


def test_a_database_that_cannot_be_reached_is_retried(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.conftest import free_port

    monkeypatch.setenv("AIRFLOW_CONN_DOWN", f"postgres://postgres@127.0.0.1:{free_port()}/postgres")
    with pytest.raises(
        sql.SourceUnavailable, match="connecting to 'down' \\(postgres\\): OperationalError"
    ) as caught:
        sql.export(_source(conn_id="down"), QUERY, tmp_path)
    assert caught.value.retryable is True


def test_sqlite_is_read_through_adbc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    database = tmp_path / "clicks.db"
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE clicks (id INTEGER, ds TEXT, x REAL)")
        db.executemany(
            "INSERT INTO clicks VALUES (?, ?, ?)", [(i, "2026-01-02", i / 7) for i in range(5_000, 0, -1)]
        )
    # Airflow's sqlite connection keeps the file's path in `host` (its docs' URI form).
    monkeypatch.setenv("AIRFLOW_CONN_CLICKS", f"sqlite://{quote(str(database), safe='')}")
    files, schema = sql.export(
        _source(conn_id="clicks", order_by=["id"], batch_rows=2_048), "SELECT * FROM clicks", tmp_path
    )
    table = pq.read_table(files[0].path)
    assert table.column("id").to_pylist() == list(range(1, 5_001)) and schema.names == ["id", "ds", "x"]
    monkeypatch.setenv("AIRFLOW_CONN_GONE", f"sqlite://{quote(str(tmp_path / 'gone.db'), safe='')}")
    with pytest.raises(sql.SourceError, match=r"SQLite database .*gone\.db' does not exist"):
        sql.export(_source(conn_id="gone"), "SELECT 1", tmp_path)
    with pytest.raises(sql.SourceError, match="no such table: nope") as caught:
        sql.export(_source(conn_id="clicks", order_by=["id"]), "SELECT * FROM nope", tmp_path)
    assert caught.value.retryable is False  # SQLite files it under OperationalError


def test_other_dbapi_connections_are_read_fetchmany_at_a_time(warehouse_url: str) -> None:
    """The path of a connection type with no ADBC driver: a DB-API cursor (psycopg here), never
    the whole result at once."""
    with psycopg.connect(warehouse_url.replace("postgres://", "postgresql://", 1)) as db:
        got = list(sql.batches(db, False, sql.ordered(QUERY, ["transaction_id"]), 4_000))
    assert [b.num_rows for b in got] == [4_000, 4_000, 2_000]
    assert got[0].column("transaction_id")[0].as_py() == "20260101-0-00000000"
    assert {str(got[0].schema.field(n).type) for n in ("amount", "hour")} == {"double", "int64"}


def test_the_window_is_the_run_s_day_or_the_days_before_it_as_quoted_literals() -> None:
    data = {
        "uri": "x",
        "label": "is_fraud",
        "features": {"numeric": ["amount"]},
        "source": _source().model_dump(),
    }
    context = date_context(datetime(2026, 1, 31, tzinfo=UTC))
    render = lambda template, names: __import__("jinja2").Template(template).render(**names)  # noqa: E731
    day = run_time_window(DataSection.model_validate(data), context, "ds=2026-01-31", render)
    assert day.names() == {
        "window_start": "'2026-01-31T00:00:00+00:00'",
        "window_end": "'2026-02-01T00:00:00+00:00'",
        "window_start_date": "'2026-01-31'",
        "window_end_date": "'2026-02-01'",
    }
    thirty = run_time_window(
        DataSection.model_validate({**data, "window": {"partitions": 30}}), context, "ds=2026-01-31", render
    )
    assert (thirty.start, thirty.end) == (datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC))
    # Airflow's context holds pendulum datetimes.
    import pendulum

    airflow_context = {**context, "logical_date": pendulum.datetime(2026, 1, 31, 2, 0, tz="UTC")}
    assert run_time_window(DataSection.model_validate(data), airflow_context, "ds=2026-01-31", render) == day
    # Hourly slots start at the run's hour.
    hourly = {**data, "partition": "hour={{ ts_nodash }}", "window": {"partitions": 24, "every": "1h"}}
    at_five = {**context, **date_context(datetime(2026, 1, 31, 5, tzinfo=UTC))}
    day_of_hours = run_time_window(
        DataSection.model_validate(hourly), at_five, "hour=20260131T050000", render
    )
    assert (day_of_hours.start, day_of_hours.end) == (
        datetime(2026, 1, 30, 6, tzinfo=UTC),
        datetime(2026, 1, 31, 6, tzinfo=UTC),
    )
    # A backfill's partition (chosen in the trigger form) moves the window with it.
    back = run_time_window(DataSection.model_validate(data), context, "ds=2026-01-10", render)
    assert (back.start, back.end) == (datetime(2026, 1, 10, tzinfo=UTC), datetime(2026, 1, 11, tzinfo=UTC))


def test_the_config_refuses_what_a_sql_source_cannot_do() -> None:
    base = {"uri": "x", "label": "is_fraud", "features": {"numeric": ["amount"]}}
    source = _source().model_dump()
    parsed = DataSection.model_validate({**base, "source": source})
    assert (parsed.wait.marker, parsed.wait.min_rows) == (None, 1)
    kept = DataSection.model_validate({**base, "source": source, "wait": {"min_rows": 500, "mode": "poke"}})
    assert (kept.wait.marker, kept.wait.min_rows, kept.wait.mode) == (None, 500, "poke")
    for data, message in (
        ({**base, "source": source, "format": "csv"}, "format: a sql source is exported as parquet"),
        (
            {**base, "source": source, "wait": {"marker": "_SUCCESS"}},
            "wait.marker: a sql source has no marker file",
        ),
        ({**base, "source": {**source, "order_by": []}}, "at least 1 item"),
        ({**base, "source": {**source, "order_by": ["a b"]}}, "is not a plain identifier"),
        ({**base, "source": {**source, "query": "SELECT 1; DROP TABLE t"}}, "expected one SELECT statement"),
        ({**base, "source": {**source, "query": "SELECT {{ x "}}, "invalid Airflow template"),
    ):
        with pytest.raises(ValueError, match=message):
            DataSection.model_validate(data)
