"""`trainpipe make-data --iceberg`: the days as an Iceberg table partitioned by day(event_time)
in a SQL catalog on SQLite, a day written again replacing its rows, the rows those of the Parquet
day plus event_time, and the connection printed."""

from __future__ import annotations

import json
import shlex
from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.cli import main as trainpipe
from airflow_trainpipe.examples.iceberg_table import connection, days_held, open_catalog
from airflow_trainpipe.examples.synthetic import write_day

DAYS = [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)]


def test_make_data_iceberg_replaces_a_day_s_rows_and_prints_the_connection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "lake"
    assert days_held(folder) == set()
    assert trainpipe(["make-data", "--iceberg", str(folder), "--days", "3", "--rows", "300"]) == 0
    out = capsys.readouterr().out
    assert f"{folder} table trainpipe.card_transactions day(event_time)=2026-01-03: 300 row(s), clean" in out
    assert out.splitlines()[-1] == f"export AIRFLOW_CONN_TRAINPIPE_LAKE={shlex.quote(connection(folder))}"
    assert json.loads(connection(folder)) == {
        "conn_type": "iceberg",
        "extra": {
            "type": "sql",
            "uri": f"sqlite:///{folder / 'catalog.db'}",
            "warehouse": (folder / "warehouse").as_uri(),
        },
    }
    # The same day again, smaller: its rows are replaced, the other days kept.
    args = ["--start", "2026-01-02", "--rows", "200", "--problem", "2026-01-02=volume:0.5"]
    assert trainpipe(["make-data", "--iceberg", str(folder), *args]) == 0
    assert "day(event_time)=2026-01-02: 100 row(s), volume:0.5" in capsys.readouterr().out
    assert days_held(folder) == set(DAYS)
    table = open_catalog(folder).load_table("trainpipe.card_transactions")
    assert [str(field) for field in table.spec().fields] == ["1000: event_time_day: day(11)"]
    counts = {
        day: table.scan(
            row_filter=f"event_time >= '{day}T00:00:00+00:00' AND event_time < '{day}T23:59:59.999999+00:00'"
        ).count()
        for day in DAYS
    }
    assert counts == {DAYS[0]: 300, DAYS[1]: 100, DAYS[2]: 300}


def test_a_day_holds_the_parquet_day_s_rows_and_its_times(tmp_path: Path) -> None:
    assert (
        trainpipe(
            ["make-data", "--iceberg", str(tmp_path / "lake"), "--start", "2026-01-02", "--rows", "500"]
        )
        == 0
    )
    rows = open_catalog(tmp_path / "lake").load_table("trainpipe.card_transactions").scan().to_arrow()
    expected = pq.read_table(write_day((tmp_path / "p").as_uri(), DAYS[1], 500)[0].removeprefix("file://"))
    assert rows.drop_columns(["event_time"]).cast(expected.schema).equals(expected)
    times = rows.column("event_time").to_pylist()
    assert times[0] == datetime(2026, 1, 2, tzinfo=UTC) and times == sorted(times)
    assert times[-1] < datetime(2026, 1, 3, tzinfo=UTC)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--problem", "2026-01-01=drop:amount"], "a table's columns are fixed"),
        (["--files", "2"], "an Iceberg day is one data file"),
    ],
)
def test_what_a_table_cannot_hold_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert trainpipe(["make-data", "--iceberg", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
