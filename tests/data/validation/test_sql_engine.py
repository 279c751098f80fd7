"""`validation.engine: sql`: the GX suite runs in PostgreSQL over the run's window query, with the
same verdicts as the streamed validator on the frozen files, and a config check that refuses an
expectation GX's SQL engine cannot run."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_trainpipe.config import load_config
from airflow_trainpipe.core.exceptions import ConfigError
from airflow_trainpipe.data.freeze import snapshot_for_date
from airflow_trainpipe.data.validation import drift
from airflow_trainpipe.data.validation.report import ValidationReport
from airflow_trainpipe.data.validation.validate import history_payload, validate_snapshot
from tests.helpers import warehouse

pytestmark = pytest.mark.slow

DAYS = [date(2026, 3, 1), date(2026, 3, 2)]
ROWS = 1200
SUITE: list[dict[str, Any]] = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "amount"}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "hour", "mostly": 0.99}},
    {
        "type": "expect_column_values_to_be_between",
        "kwargs": {"column": "amount", "min_value": 0, "max_value": 50000},
    },
    {
        "type": "expect_column_values_to_be_between",
        "kwargs": {"column": "hour", "min_value": 0, "max_value": 23},
    },
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "is_fraud", "value_set": [0, 1]}},
    {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "transaction_id"}},
    {
        "type": "expect_column_mean_to_be_between",
        "kwargs": {"column": "amount", "min_value": 0, "max_value": 5000},
    },
    {
        "type": "expect_column_quantile_values_to_be_between",
        "kwargs": {
            "column": "hour",
            "quantile_ranges": {"quantiles": [0.1, 0.9], "value_ranges": [[0, 10], [10, 23]]},
        },
    },
    {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1000}},
]


@pytest.fixture(scope="module")
def warehouse_url(postgres_server) -> str:
    url = warehouse.create_database(postgres_server.url, "sql_engine_tests")
    warehouse.load_days(url, DAYS, ROWS)
    return url


def _config_file(folder: Path, engine: str, expectations: list[dict[str, Any]] = SUITE) -> Path:
    path = warehouse.sql_config(folder)
    raw = yaml.safe_load(path.read_text())
    raw["validation"].update(engine=engine, expectations=expectations)
    raw["validation"]["volume"].pop("max_change", None)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _validated(
    folder: Path, engine: str, day: str, reference: ValidationReport | None = None
) -> ValidationReport:
    config = load_config(_config_file(folder / engine, engine))
    manifest = snapshot_for_date(config, day)
    assert manifest.source is not None
    record = None
    if reference is not None:
        record = {**history_payload(reference), "partition": reference.partition}
    return validate_snapshot(
        config, day, manifest, reference=record, previous=None, query=manifest.source.query
    )


def _verdicts(report: ValidationReport) -> list[tuple[str, str | None, bool, Any]]:
    """Each expectation's verdict; the unexpected count where it is one (aggregates may differ in
    the last digits between pandas and the database, quantiles in their interpolation)."""
    return [
        (c.name, c.column, c.passed, c.observed if isinstance(c.observed, int) else None)
        for c in report.checks
        if c.kind == "expectation"
    ]


def test_the_sql_engine_gives_the_stream_engine_s_verdicts(
    warehouse_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", warehouse_url)
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(drift, "SAMPLE_ROWS", 500)  # numeric profiles from every 3rd value: the stride counts
    for engine in ("stream", "sql"):
        (tmp_path / engine).mkdir()
    passing = {engine: _validated(tmp_path, engine, "2026-03-01") for engine in ("stream", "sql")}
    assert passing["sql"].passed, passing["sql"].failure_table()
    assert _verdicts(passing["sql"]) == _verdicts(passing["stream"])
    assert len(_verdicts(passing["sql"])) == len(SUITE)
    unchanged = [c for c in passing["sql"].checks if c.name == "source_unchanged"]
    assert [(c.passed, c.observed) for c in unchanged] == [(True, ROWS)]
    assert "Data documentation compiled by Great Expectations" in (passing["sql"].data_docs_html or "")

    # Upstream breaks the second day: negative amounts, out-of-range and missing hours, a label
    # that is neither 0 nor 1 (a duplicate key cannot reach validation: the export refuses it).
    day = "event_time >= '2026-03-02' AND event_time < '2026-03-03'"
    warehouse.execute(
        warehouse_url,
        f"UPDATE card_transactions SET amount = -1 WHERE {day} AND hour = 3",
        f"UPDATE card_transactions SET hour = 30 WHERE {day} AND hour = 5",
        f"UPDATE card_transactions SET hour = NULL WHERE {day} AND hour = 7",
        f"UPDATE card_transactions SET is_fraud = 2 WHERE {day} AND hour = 9",
    )
    broken = {
        engine: _validated(tmp_path, engine, "2026-03-02", passing[engine]) for engine in ("stream", "sql")
    }
    assert _verdicts(broken["sql"]) == _verdicts(broken["stream"])
    # The drift profiles counted in the database are the streamed ones, and so are the scores.
    assert passing["sql"].profiles == passing["stream"].profiles
    assert broken["sql"].profiles == broken["stream"].profiles
    assert broken["sql"].profiles["hour"]["nulls"] > 0
    assert broken["sql"].drift_scores == broken["stream"].drift_scores
    assert set(broken["sql"].drift_scores) == set(broken["sql"].profiles)
    failed = {(c.name, c.column) for c in broken["sql"].failures if c.kind == "expectation"}
    assert failed == {
        ("expect_column_values_to_not_be_null", "hour"),
        ("expect_column_values_to_be_between", "amount"),
        ("expect_column_values_to_be_between", "hour"),
        ("expect_column_values_to_be_in_set", "is_fraud"),
    }, broken["sql"].failure_table()


def test_an_expectation_sql_cannot_run_is_refused_by_the_config_check(tmp_path: Path) -> None:
    rules = [
        *SUITE,
        {"type": "expect_column_values_to_be_increasing", "kwargs": {"column": "transaction_id"}},
    ]
    with pytest.raises(ConfigError) as caught:
        load_config(_config_file(tmp_path, "sql", rules))
    [problem] = caught.value.problems
    assert problem.path == f"validation.expectations[{len(SUITE)}].type"
    assert "expect_column_values_to_be_increasing cannot run on validation.engine 'sql'" in problem.message
    assert load_config(_config_file(tmp_path, "stream", rules)).validation.engine == "stream"


DAG = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_trainpipe.operators.validate import DataValidateOperator

with DAG("validate_sql_engine", schedule="@daily", start_date=datetime(2026, 1, 1), catchup=False) as dag:
    DataValidateOperator(task_id="validate_data", config={config!r}, retries=0)
"""


def test_validate_data_runs_the_suite_in_the_database(
    airflow_env: dict[str, str], postgres_server, tmp_path: Path
) -> None:
    from tests.helpers.airflow_dags import run_dag_file_for_dates

    url = warehouse.create_database(postgres_server.url, "sql_engine_dag")
    warehouse.load_days(url, [date(2026, 1, 1), date(2026, 1, 2)], ROWS)
    config = _config_file(tmp_path, "sql")
    broken = "UPDATE card_transactions SET amount = -1 WHERE event_time >= '2026-01-02' AND hour = 3"
    runs = run_dag_file_for_dates(
        {**airflow_env, "AIRFLOW_CONN_WAREHOUSE": url},
        "validate_sql_engine",
        DAG.format(config=str(config)),
        ["2026-01-01", "2026-01-02"],
        before_run=lambda _date: warehouse.execute(url, broken),
    )
    first, second = runs
    assert first.tasks == {"validate_data": "success"}, first.output[-6000:]
    assert "validation.engine sql: the expectations and drift profiles run in warehouse" in first.output
    assert "all 12 check(s) passed" in first.output, first.output[-6000:]
    assert second.tasks == {"validate_data": "failed"}, second.output[-6000:]
    assert "expect_column_values_to_be_between(amount): " in second.output, second.output[-6000:]


def test_gx_never_pulls_the_window_s_rows_to_read_its_columns(
    warehouse_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GX 1.24 reads a query asset's column names by executing the bare query; it runs as LIMIT 0."""
    import sqlalchemy as sa

    from airflow_trainpipe.config.validation import ExpectationRule
    from airflow_trainpipe.data.validation.sql_engine import SqlExpectationRunner, sqlalchemy_url

    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", warehouse_url)
    query = "SELECT * FROM card_transactions"
    fetched: list[tuple[str, int]] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        fetched.append((statement, cursor.rowcount))

    runner = SqlExpectationRunner(
        [ExpectationRule.model_validate(SUITE[0])], sqlalchemy_url("warehouse"), query
    )
    sa.event.listen(sa.engine.Engine, "after_cursor_execute", record)
    try:
        [outcome] = runner.run()
    finally:
        sa.event.remove(sa.engine.Engine, "after_cursor_execute", record)
    assert outcome.success and outcome.result["element_count"] == runner.row_count() > 0
    assert fetched and all(rows <= 20 for _, rows in fetched), fetched
    assert not any(statement.strip() == query for statement, _ in fetched)


def test_sqlite_runs_the_suite_and_the_profiles_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3
    from urllib.parse import quote

    import numpy as np
    import pyarrow as pa

    from airflow_trainpipe.config.validation import ExpectationRule
    from airflow_trainpipe.data.validation.sql_engine import (
        SqlExpectationRunner,
        fill_profiles,
        sqlalchemy_url,
    )

    database = tmp_path / "a warehouse.db"
    rows = [
        (i, None if i % 50 == 0 else (-1.0 if i % 97 == 0 else i / 7), "abc"[i % 3]) for i in range(1, 1001)
    ]
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE t (id INTEGER, x REAL, c TEXT)")
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    monkeypatch.setenv("AIRFLOW_CONN_LOCAL", f"sqlite://{quote(str(database), safe='')}")
    monkeypatch.setattr(drift, "SAMPLE_ROWS", 300)
    rules = [
        ExpectationRule(type="expect_column_values_to_be_between", kwargs={"column": "x", "min_value": 0}),
        ExpectationRule(type="expect_column_values_to_not_be_null", kwargs={"column": "x"}),
    ]
    runner = SqlExpectationRunner(rules, sqlalchemy_url("local"), "SELECT * FROM t WHERE id > 0;")
    between, not_null = runner.run()
    assert (between.success, between.result["unexpected_count"]) == (False, 10)
    assert (not_null.success, not_null.result["unexpected_count"]) == (False, 20)

    edges = np.array([1.0, 50.0, 100.0])
    in_db = {"x": drift.NumericAccumulator(1000, edges), "c": drift.CategoricalAccumulator()}
    fill_profiles(runner, ["id"], in_db)
    streamed = {"x": drift.NumericAccumulator(1000, edges), "c": drift.CategoricalAccumulator()}
    for start in range(0, 1000, 128):  # the exported file's row groups, in id order
        for name, index in (("x", 1), ("c", 2)):
            streamed[name].add(pa.array([r[index] for r in rows[start : start + 128]]))
    assert {n: a.profile() for n, a in in_db.items()} == {n: a.profile() for n, a in streamed.items()}
    assert in_db["x"].at_or_below.tolist() == streamed["x"].at_or_below.tolist()
