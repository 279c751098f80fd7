"""Each injected problem is caught by the check meant for it, with the column named; a clean day passes."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.config import PipelineConfig, parse_config
from airflow_trainpipe.data.snapshots.manifests import resolve_snapshot
from airflow_trainpipe.data.validation import history
from airflow_trainpipe.data.validation.report import ValidationReport
from airflow_trainpipe.data.validation.validate import history_payload, validate_snapshot, write_report
from airflow_trainpipe.examples.synthetic import Problem, write_day
from tests.conftest import EXAMPLE_CONFIGS

ROWS = 4000


def _config(root: Path, **replacements: str) -> PipelineConfig:
    text = (
        (EXAMPLE_CONFIGS / "fraud_detector.yaml")
        .read_text()
        .replace("uri: data/card_transactions", f"uri: {root.as_uri()}")
    )
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    return parse_config(text)


def _validate(config: PipelineConfig, day: int) -> ValidationReport:
    partition = f"ds=2026-01-{day:02d}"
    previous = history.previous(config.data, config.pipeline, partition)
    report = validate_snapshot(
        config, partition, resolve_snapshot(config.data, partition), reference=previous, previous=previous
    )
    if report.passed:
        history.record(config.data, config.pipeline, partition, history_payload(report))
    return report


def _failed(report: ValidationReport) -> set[tuple[str, str | None]]:
    return {(f"{c.kind}:{c.name}", c.column) for c in report.failures}


@pytest.fixture(scope="module")
def two_clean_days(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("days")
    for day in (1, 2):
        write_day(root.as_uri(), date(2026, 1, day), ROWS, seed=1)
    return root


@pytest.mark.parametrize(
    ("problem", "caught"),
    [
        (None, set()),
        ("nulls:amount:0.1", {("expectation:expect_column_values_to_not_be_null", "amount")}),
        ("out_of_range:hour:99", {("expectation:expect_column_values_to_be_between", "hour")}),
        ("drop:merchant_risk", {("schema:column present", "merchant_risk")}),
        (
            "rename:amount:amt",
            {
                ("schema:column present", "amount"),
                ("schema:unexpected column", "amt"),
                ("expectation:expect_column_values_to_not_be_null", "amount"),
                ("expectation:expect_column_values_to_be_between", "amount"),
            },
        ),
        (
            "dtype:hour",
            {("schema:column type", "hour"), ("expectation:expect_column_values_to_be_between", "hour")},
        ),
        ("volume:0.3", {("volume:max_change", None)}),
        ("drift:amount,channel", {("drift:psi", "amount"), ("drift:chi2", "channel")}),
    ],
    # Sorted: a set's repr is in hash order, which differs between processes (pytest-xdist's
    # workers must collect the same ids).
    ids=lambda v: str(sorted(v, key=str)) if isinstance(v, set) else str(v),
)
def test_each_problem_is_caught_by_its_check(
    tmp_path: Path, two_clean_days: Path, problem: str | None, caught: set[tuple[str, str | None]]
) -> None:
    root = tmp_path / "data"
    for day in (1, 2):
        (root / f"ds=2026-01-{day:02d}").mkdir(parents=True)
        for item in (two_clean_days / f"ds=2026-01-{day:02d}").iterdir():
            if item.is_file():
                (root / item.parent.name / item.name).write_bytes(item.read_bytes())
    write_day(
        root.as_uri(), date(2026, 1, 3), ROWS, seed=1, problems=[Problem.parse(problem)] if problem else []
    )
    config = _config(root)
    assert _validate(config, 1).passed and _validate(config, 2).passed
    report = _validate(config, 3)
    assert _failed(report) == caught, report.failure_table()
    if problem and problem.startswith("drift"):
        # Every feature is scored; only the drifted ones fail.
        assert set(report.drift_scores) == set(config.data.features.all)
        assert report.failure_summary() == "drift: amount, channel"
    assert report.reference is not None and report.reference["partition"] == "ds=2026-01-02"


def test_streaming_in_small_batches_gives_the_same_verdicts_and_counts(tmp_path: Path) -> None:
    write_day(tmp_path.as_uri(), date(2026, 1, 1), ROWS, seed=1)
    write_day(
        tmp_path.as_uri(),
        date(2026, 1, 2),
        ROWS,
        seed=1,
        problems=[Problem.parse("nulls:amount:0.02")],
        files=3,
    )
    mostly = "kwargs: {column: amount}\n"
    reports = {}
    for batch_rows in (1_000_000, 333):
        config = _config(
            tmp_path / str(batch_rows),
            **{
                mostly: "kwargs: {column: amount, mostly: 0.97}\n",
                "max_change: 0.5": f"max_change: 0.5\n  batch_rows: {batch_rows}",
            },
        )
        config = config.model_copy(update={"data": config.data.model_copy(update={"uri": tmp_path.as_uri()})})
        day1 = validate_snapshot(
            config,
            "ds=2026-01-01",
            resolve_snapshot(config.data, "ds=2026-01-01"),
            reference=None,
            previous=None,
        )
        record = {"partition": "ds=2026-01-01", **history_payload(day1)}
        reports[batch_rows] = validate_snapshot(
            config,
            "ds=2026-01-02",
            resolve_snapshot(config.data, "ds=2026-01-02"),
            reference=record,
            previous=record,
        )
    whole, streamed = reports[1_000_000], reports[333]
    assert [(c.name, c.column, c.passed, c.observed) for c in whole.checks] == [
        (c.name, c.column, c.passed, c.observed) for c in streamed.checks
    ]
    not_null = next(c for c in streamed.checks if c.name == "expect_column_values_to_not_be_null")
    # ~2% nulls: several 333-row batches exceed 3% on their own, the snapshot as a whole does not.
    assert not_null.passed and 40 < not_null.observed < 120


def test_uniqueness_across_batches_and_quantiles_with_numpy_bools(tmp_path: Path) -> None:
    write_day(tmp_path.as_uri(), date(2026, 1, 1), ROWS, seed=1)
    part = tmp_path / "ds=2026-01-01" / "part-00000.parquet"
    table = pq.read_table(part)
    ids = table["transaction_id"].to_pylist()
    ids[-1] = ids[0]  # a duplicate far apart: only a whole-column check can see it
    pq.write_table(table.set_column(0, "transaction_id", pa.array(ids)), part, row_group_size=500)
    quantiles = (
        "    - type: expect_column_values_to_be_unique\n",
        "    - type: expect_column_quantile_values_to_be_between\n"
        "      kwargs: {column: merchant_risk, quantile_ranges: {quantiles: [0.1, 0.5, 0.9], "
        "value_ranges: [[0.0, 0.2], [0.1, 0.3], [0.2, 0.5]]}}\n"
        "    - type: expect_column_values_to_be_unique\n",
    )
    config = _config(
        tmp_path, **{quantiles[0]: quantiles[1], "max_change: 0.5": "max_change: 0.5\n  batch_rows: 700"}
    )
    report = validate_snapshot(
        config, "ds=2026-01-01", resolve_snapshot(config.data, "ds=2026-01-01"), reference=None, previous=None
    )
    assert _failed(report) == {("expectation:expect_column_values_to_be_unique", "transaction_id")}
    quantile = next(c for c in report.checks if c.name == "expect_column_quantile_values_to_be_between")
    assert quantile.passed is True  # a Python bool, not numpy.bool_
    written = write_report(report)
    saved = json.loads(Path(written["report"].removeprefix("file://")).read_text())
    assert saved["passed"] is False and saved["digest"] == report.manifest.digest
    html = Path(written["data_docs"].removeprefix("file://")).read_text()
    assert "expect_column_quantile_values_to_be_between" in html or "quantile" in html
    assert written["report"].startswith(f"{tmp_path.as_uri()}/ds=2026-01-01/_trainpipe/fraud_detector/")


def test_ks_and_per_feature_thresholds(tmp_path: Path) -> None:
    write_day(tmp_path.as_uri(), date(2026, 1, 1), ROWS, seed=1)
    write_day(
        tmp_path.as_uri(),
        date(2026, 1, 2),
        ROWS,
        seed=1,
        problems=[Problem.parse("drift:distance_from_home_km")],
    )
    config = _config(
        tmp_path,
        **{
            "numeric_method: psi": "numeric_method: ks",
            "feature_thresholds: {amount: 0.25}": "feature_thresholds: {distance_from_home_km: 0.9}",
        },
    )
    assert _validate(config, 1).passed
    report = _validate(config, 2)
    assert report.passed, report.failure_table()  # drifted, but its own threshold is 0.9
    assert 0.2 < report.drift_scores["distance_from_home_km"] < 0.9
    assert report.drift_scores["amount"] < 0.05


def test_previous_means_the_latest_earlier_partition(tmp_path: Path) -> None:
    config = _config(tmp_path)
    for day in (1, 3):
        history.record(config.data, config.pipeline, f"ds=2026-01-0{day}", {"digest": f"d{day}", "rows": day})
    assert history.previous(config.data, config.pipeline, "ds=2026-01-02")["digest"] == "d1"  # a backfill
    assert history.previous(config.data, config.pipeline, "ds=2026-01-04")["digest"] == "d3"
    assert history.previous(config.data, config.pipeline, "ds=2026-01-01") is None
    assert history.by_digest(config.data, config.pipeline, "d3")["partition"] == "ds=2026-01-03"
