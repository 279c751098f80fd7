"""`validation.engine: spark`: the GX suite and the drift profiles on a real Spark Connect server
(tests/helpers/spark_connect.py), over exactly the manifest's files, with the verdicts and the
drift figures of the streamed validator on the same snapshot; a server that cannot be reached is
a retryable error naming the pipeline, the engine and the address."""

from __future__ import annotations

import json
import sys
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import yaml
from airflow.sdk.definitions.retry_policy import RetryAction

from airflow_trainpipe.config import load_config
from airflow_trainpipe.contracts.manifest import Manifest
from airflow_trainpipe.core.retry_policy import TRAINPIPE_RETRY_POLICY
from airflow_trainpipe.data.snapshots.manifests import resolve_snapshot
from airflow_trainpipe.data.validation import drift
from airflow_trainpipe.data.validation.report import ValidationReport
from airflow_trainpipe.data.validation.spark_connect import SparkEngineError, SparkUnavailable
from airflow_trainpipe.data.validation.validate import history_payload, validate_snapshot
from airflow_trainpipe.examples.synthetic import Problem, write_day
from tests.conftest import EXAMPLE_CONFIGS, free_port

pytestmark = pytest.mark.slow

ROWS = 1200
BROKEN = [
    Problem.parse("nulls:hour:0.05"),
    Problem.parse("out_of_range:amount"),
    Problem.parse("drift:country,merchant_risk"),
]
SUITE: list[dict[str, Any]] = [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "amount"}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "hour", "mostly": 0.99}},
    {
        "type": "expect_column_values_to_be_between",
        "kwargs": {"column": "amount", "min_value": 0, "max_value": 50000},
    },
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "is_fraud", "value_set": [0, 1]}},
    {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "transaction_id"}},
    {
        "type": "expect_column_mean_to_be_between",
        "kwargs": {"column": "merchant_risk", "min_value": 0, "max_value": 0.5},
    },
    {
        # GX 1.24's result of this one holds a numpy.bool_ (ValidationDefinition.run cannot store it)
        "type": "expect_column_quantile_values_to_be_between",
        "kwargs": {
            "column": "txn_count_24h",
            "quantile_ranges": {"quantiles": [0.1, 0.9], "value_ranges": [[0, 2], [2, 6]]},
        },
    },
    {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 1000}},
]


@pytest.fixture(scope="module")
def data_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two days in several files each under a folder with a space (file:// escapes it, Hadoop must
    not see it escaped twice); the second day broken: nulls, a sentinel amount, drift."""
    root = tmp_path_factory.mktemp("spark engine") / "card transactions"
    write_day(root.as_uri(), date(2026, 3, 1), ROWS, files=2)
    write_day(root.as_uri(), date(2026, 3, 2), ROWS, files=3, problems=BROKEN)
    return root.as_uri()


def _config_file(folder: Path, data_uri: str, engine: str, remote: str | None = None) -> Path:
    raw = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text())
    raw["data"]["uri"] = data_uri
    raw["validation"].update(engine=engine, expectations=SUITE)
    if remote is not None:
        raw["validation"]["spark_remote"] = remote
    raw["validation"]["volume"].pop("max_change", None)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{engine}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _validated(config_path: Path, day: str, reference: ValidationReport | None = None) -> ValidationReport:
    config = load_config(config_path)
    record = {**history_payload(reference), "partition": reference.partition} if reference else None
    manifest = resolve_snapshot(config.data, day)
    return validate_snapshot(config, day, manifest, reference=record, previous=None)


def _verdicts(report: ValidationReport) -> list[tuple[str, str | None, bool, Any]]:
    """Each expectation's verdict, with its unexpected count where it is one (aggregates such as a
    mean may differ in the last digits, quantiles in their interpolation)."""
    return [
        (c.name, c.column, c.passed, c.observed if isinstance(c.observed, int) else None)
        for c in report.checks
        if c.kind == "expectation"
    ]


def test_spark_gives_the_stream_engine_s_verdicts_and_drift(
    spark_connect: Any, data_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(drift, "SAMPLE_ROWS", 500)  # numeric profiles from every 3rd value: the stride counts
    configs = {
        "stream": _config_file(tmp_path, data_uri, "stream"),
        "spark": _config_file(tmp_path, data_uri, "spark", spark_connect.url),
    }
    clean = {engine: _validated(path, "ds=2026-03-01") for engine, path in configs.items()}
    assert clean["spark"].passed, clean["spark"].failure_table()
    assert _verdicts(clean["spark"]) == _verdicts(clean["stream"])
    assert len(_verdicts(clean["spark"])) == len(SUITE)
    unchanged = [c for c in clean["spark"].checks if c.name == "files_unchanged"]
    assert [(c.passed, c.observed) for c in unchanged] == [(True, ROWS)]
    assert "Data documentation compiled by Great Expectations" in (clean["spark"].data_docs_html or "")
    json.dumps(clean["spark"].to_dict())  # the quantile's numpy.bool_ made plain

    broken = {engine: _validated(path, "ds=2026-03-02", clean[engine]) for engine, path in configs.items()}
    assert _verdicts(broken["spark"]) == _verdicts(broken["stream"])
    # The profiles Spark aggregates are the streamed ones (nulls, edges, samples, categories),
    # and so are the drift scores judged from them.
    assert clean["spark"].profiles == clean["stream"].profiles
    assert broken["spark"].profiles == broken["stream"].profiles
    assert broken["spark"].profiles["hour"]["nulls"] > 0
    assert broken["spark"].drift_scores == broken["stream"].drift_scores
    assert set(broken["spark"].drift_scores) == set(broken["spark"].profiles)
    failed = {(c.kind, c.name, c.column) for c in broken["spark"].failures}
    assert failed == {
        ("expectation", "expect_column_values_to_not_be_null", "hour"),
        ("expectation", "expect_column_values_to_be_between", "amount"),
        ("drift", "psi", "merchant_risk"),
        ("drift", "chi2", "country"),
    }, broken["spark"].failure_table()


def test_an_unreachable_server_is_retryable_and_named(
    data_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"sc://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("SPARK_REMOTE", address)  # the default when the config names no server
    config = load_config(_config_file(tmp_path, data_uri, "spark"))
    manifest = resolve_snapshot(config.data, "ds=2026-03-01")
    with pytest.raises(SparkUnavailable) as caught:
        validate_snapshot(config, "ds=2026-03-01", manifest, reference=None, previous=None)
    message = str(caught.value)
    assert f"pipeline {config.pipeline}: validation.engine spark" in message
    assert f"Spark Connect server at {address} cannot be reached (UNAVAILABLE" in message
    assert TRAINPIPE_RETRY_POLICY.evaluate(caught.value, 1, 3).action == RetryAction.RETRY


def test_a_file_the_server_cannot_read_and_a_missing_pyspark_are_final(
    spark_connect: Any, data_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(_config_file(tmp_path, data_uri, "spark", spark_connect.url))
    manifest = resolve_snapshot(config.data, "ds=2026-03-01")
    gone = Manifest.model_validate(
        {
            **manifest.model_dump(),
            "files": [{**manifest.files[0].model_dump(), "uri": f"{data_uri}/gone.parquet"}],
        }
    )
    with pytest.raises(SparkEngineError) as caught:
        validate_snapshot(config, "ds=2026-03-01", gone, reference=None, previous=None)
    assert not caught.value.retryable
    assert f"Spark Connect server at {spark_connect.url} failed to count" in str(caught.value)
    assert "PATH_NOT_FOUND" in str(caught.value)

    monkeypatch.setitem(sys.modules, "pyspark.sql", None)  # as when the extra is not installed
    with pytest.raises(SparkEngineError, match=r"pip install 'airflow-trainpipe\[spark\]'"):
        validate_snapshot(config, "ds=2026-03-01", manifest, reference=None, previous=None)
