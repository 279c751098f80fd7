"""`trainpipe make-data`: deterministic days, and each injected problem does what it says; the
same days as rows of an SQLite table (`--sqlite`), for the sql source example."""

from __future__ import annotations

import contextlib
from datetime import date
from pathlib import Path
from urllib.parse import quote

import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.cli import main as trainpipe
from airflow_trainpipe.examples.synthetic import Problem, sqlite_connection_uri, write_day, write_day_sqlite

DAY = date(2026, 1, 3)


def _day(tmp_path: Path, *problems: str):
    files = write_day(tmp_path.as_uri(), DAY, 2000, seed=3, problems=[Problem.parse(p) for p in problems])
    return pq.read_table(files[0].removeprefix("file://"))


def test_same_seed_same_bytes_and_another_seed_differs(tmp_path: Path) -> None:
    a = write_day(
        (tmp_path / "a").as_uri(), DAY, 500, seed=1, problems=[Problem.parse("drift:amount,channel")]
    )
    b = write_day(
        (tmp_path / "b").as_uri(), DAY, 500, seed=1, problems=[Problem.parse("drift:amount,channel")]
    )
    c = write_day((tmp_path / "c").as_uri(), DAY, 500, seed=2)
    read = lambda uri: Path(uri.removeprefix("file://")).read_bytes()  # noqa: E731
    assert read(a[0]) == read(b[0]) != read(c[0])
    assert (tmp_path / "a" / "ds=2026-01-03" / "_SUCCESS").exists()


def test_each_problem_changes_what_it_names(tmp_path: Path) -> None:
    clean = _day(tmp_path / "clean")
    assert "amount" not in _day(tmp_path / "drop", "drop:amount").column_names
    renamed = _day(tmp_path / "rename", "rename:amount:amt")
    assert "amt" in renamed.column_names and "amount" not in renamed.column_names
    assert str(_day(tmp_path / "dtype", "dtype:hour").schema.field("hour").type) == "string"
    # A column of strings arrives as numbers (a cast to string left it as it was, said injected).
    lengths = _day(tmp_path / "dtype_text", "dtype:channel")["channel"]
    assert str(lengths.type) == "int64" and lengths.to_pylist()[:3] == [
        len(c) for c in clean["channel"].to_pylist()[:3]
    ]
    assert _day(tmp_path / "nulls", "nulls:amount:0.3")["amount"].null_count == pytest.approx(600, rel=0.15)
    assert (_day(tmp_path / "range", "out_of_range:hour:99")["hour"].to_numpy() == 99).sum() > 50
    assert _day(tmp_path / "volume", "volume:0.25").num_rows == 500
    drifted = _day(tmp_path / "drift", "drift:amount")
    assert drifted["amount"].to_numpy().mean() > 1.8 * clean["amount"].to_numpy().mean()
    assert drifted["hour"].equals(clean["hour"])  # only the named feature moves
    late = _day(tmp_path / "late", "late_labels:channel:online")
    online = clean["channel"].to_numpy(zero_copy_only=False) == "online"
    assert clean["is_fraud"].to_numpy()[online].sum() > 0
    assert late["is_fraud"].to_numpy()[online].sum() == 0  # the segment's frauds read as genuine
    assert (late["is_fraud"].to_numpy()[~online] == clean["is_fraud"].to_numpy()[~online]).all()
    assert late.drop_columns(["is_fraud"]).equals(clean.drop_columns(["is_fraud"]))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--problem", "2026-01-01=explode:amount"], "unknown problem 'explode'"),
        (["--problem", "2026-01-01=drop:no_such"], "no column 'no_such'"),
        (["--problem", "2026-01-01=rename:amount"], "rename takes 2 argument(s)"),
        (["--problem", "drop:amount"], "expected DAY=KIND[:ARGS]"),
        (["--problem", "2026-02-01=drop:amount"], "not among the 1 day(s)"),
    ],
)
def test_make_data_rejects_bad_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert trainpipe(["make-data", "--out", str(tmp_path), "--rows", "100", *args]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_make_data_writes_the_days_it_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = trainpipe(
        [
            "make-data",
            "--out",
            str(tmp_path),
            "--days",
            "3",
            "--rows",
            "300",
            "--files",
            "2",
            "--problem",
            "2026-01-03=drift:amount",
        ]
    )
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds=2026-01-01", "ds=2026-01-02", "ds=2026-01-03"]
    assert len(list((tmp_path / "ds=2026-01-02").glob("*.parquet"))) == 2
    assert "ds=2026-01-03: 2 file(s), drift:amount" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("kind", "label", "check"),
    [
        (
            "support_tickets",
            "team",
            lambda t: set(t.column("team").to_pylist()) == {"account", "billing", "shipping", "technical"},
        ),
        ("search_results", "relevance", lambda t: set(t.column("relevance").to_pylist()) <= set(range(5))),
    ],
)
def test_make_data_writes_multiclass_and_ranking_days(tmp_path: Path, kind: str, label: str, check) -> None:
    assert trainpipe(["make-data", "--out", str(tmp_path / "a"), "--kind", kind, "--rows", "3000"]) == 0
    assert trainpipe(["make-data", "--out", str(tmp_path / "b"), "--kind", kind, "--rows", "3000"]) == 0
    a, b = (tmp_path / p / "ds=2026-01-01" / "part-00000.parquet" for p in "ab")
    assert a.read_bytes() == b.read_bytes()
    table = pq.read_table(a)
    assert check(table) and abs(table.num_rows - 3000) < 40


def test_search_results_keep_each_query_s_rows_together_and_most_results_irrelevant(tmp_path: Path) -> None:
    import numpy as np

    table = pq.read_table(
        write_day(tmp_path.as_uri(), DAY, 4000, seed=1, kind="search_results")[0].removeprefix("file://")
    )
    queries = np.asarray(table.column("query_id").to_pylist())
    runs = np.count_nonzero(queries[1:] != queries[:-1]) + 1
    assert runs == len(set(queries.tolist()))  # one run per query
    relevant = np.asarray(table.column("relevance")) > 0
    assert 0.1 < relevant.mean() < 0.5


def _sqlite_rows(database: Path) -> list[tuple[str, int]]:
    import sqlite3

    with contextlib.closing(sqlite3.connect(database)) as db:
        return db.execute(
            "SELECT event_date, COUNT(*) FROM card_transactions GROUP BY event_date ORDER BY event_date"
        ).fetchall()


def test_make_data_sqlite_replaces_a_day_s_rows_and_prints_the_connection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = tmp_path / "wh" / "warehouse.db"
    assert trainpipe(["make-data", "--sqlite", str(database), "--days", "3", "--rows", "300"]) == 0
    out = capsys.readouterr().out
    assert f"{database} table card_transactions event_date=2026-01-03: 300 row(s), clean" in out
    export = out.splitlines()[-1]
    assert export == f"export AIRFLOW_CONN_TRAINPIPE_WAREHOUSE=sqlite://{quote(str(database), safe='')}"
    # The same day again, smaller: its rows are replaced, the other days kept.
    args = ["--start", "2026-01-02", "--rows", "200", "--problem", "2026-01-02=volume:0.5"]
    assert trainpipe(["make-data", "--sqlite", str(database), *args]) == 0
    assert "event_date=2026-01-02: 100 row(s), volume:0.5" in capsys.readouterr().out
    assert _sqlite_rows(database) == [("2026-01-01", 300), ("2026-01-02", 100), ("2026-01-03", 300)]


def test_the_sqlite_table_reads_back_through_the_sql_source_as_the_parquet_day(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_trainpipe.config.sources import SqlSource
    from airflow_trainpipe.data.sources import sql

    database = tmp_path / "warehouse.db"
    for day in (DAY, date(2026, 1, 4)):
        write_day_sqlite(database, day, 700, seed=3)
    monkeypatch.setenv("AIRFLOW_CONN_TRAINPIPE_WAREHOUSE", sqlite_connection_uri(database))
    source = SqlSource(kind="sql", conn_id="trainpipe_warehouse", query="x", order_by=["transaction_id"])
    # TEXT dates compare as dates: the window [2026-01-03, 2026-01-04) is the first day alone.
    query = "SELECT * FROM card_transactions WHERE event_date >= '2026-01-03' AND event_date < '2026-01-04'"
    files, _ = sql.export(source, query, tmp_path)
    table = pq.read_table(files[0].path)
    expected = pq.read_table(
        write_day((tmp_path / "p").as_uri(), DAY, 700, seed=3)[0].removeprefix("file://")
    )
    assert table.drop_columns(["event_date"]).equals(expected)
    assert set(table.column("event_date").to_pylist()) == {"2026-01-03"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--problem", "2026-01-01=dtype:hour"], "problem dtype:hour: a table's columns are fixed"),
        (["--files", "2"], "--files splits Parquet days"),
    ],
)
def test_make_data_sqlite_refuses_what_a_table_cannot_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert trainpipe(["make-data", "--sqlite", str(tmp_path / "w.db"), "--rows", "100", *args]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
