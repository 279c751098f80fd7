"""Validated-snapshot records: where they are written, and which one is "previous" or matches a digest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.data.validation import history

PIPELINE = "fraud_detector"


def _data(uri: str) -> DataSection:
    return DataSection.model_validate({"uri": uri, "label": "is_fraud", "features": {"numeric": ["amount"]}})


@pytest.fixture
def data(tmp_path: Path) -> DataSection:
    return _data(tmp_path.as_uri())


def _record_all(data: DataSection, partitions: dict[str, str], pipeline: str = PIPELINE) -> None:
    """Record each partition with its digest, and rows numbered in insertion order."""
    for rows, (partition, digest) in enumerate(partitions.items()):
        history.record(data, pipeline, partition, {"digest": digest, "rows": rows})


def _partitions(records: list[dict]) -> list[str]:
    return [r["partition"] for r in records]


def test_a_record_is_one_json_file_per_partition_under_the_state_folder(
    data: DataSection, tmp_path: Path
) -> None:
    uri = history.record(data, PIPELINE, "ds=2026-01-05", {"rows": 12, "digest": "abc"})
    path = tmp_path / "_trainpipe" / "validated" / PIPELINE / "ds=2026-01-05.json"
    assert uri == f"file://{path}"
    assert path.read_text() == '{"digest": "abc", "partition": "ds=2026-01-05", "rows": 12}'


def test_nested_partitions_are_flattened_into_one_file_name(data: DataSection, tmp_path: Path) -> None:
    uri = history.record(data, PIPELINE, "/year=2026/month=01/", {"digest": "d"})
    assert uri.endswith(f"/validated/{PIPELINE}/year=2026__month=01.json")
    assert json.loads(Path(uri.removeprefix("file://")).read_text())["partition"] == "/year=2026/month=01/"


def test_no_records_before_the_first_validation(data: DataSection) -> None:
    assert history.records(data, PIPELINE) == []
    assert history.previous(data, PIPELINE, "ds=2026-01-01") is None
    assert history.by_digest(data, PIPELINE, "abc") is None


def test_records_come_in_partition_order_whatever_the_order_they_were_written(data: DataSection) -> None:
    _record_all(data, {"ds=2026-01-03": "c", "ds=2026-01-01": "a", "ds=2026-01-02": "b"})
    assert _partitions(history.records(data, PIPELINE)) == ["ds=2026-01-01", "ds=2026-01-02", "ds=2026-01-03"]


def test_files_that_are_not_json_records_are_ignored(data: DataSection, tmp_path: Path) -> None:
    _record_all(data, {"ds=2026-01-01": "a"})
    folder = tmp_path / "_trainpipe" / "validated" / PIPELINE
    (folder / "ds=2026-01-02.json.tmp").write_text("{partial")
    (folder / "README").write_text("not a record")
    assert _partitions(history.records(data, PIPELINE)) == ["ds=2026-01-01"]


def test_revalidating_a_partition_compares_with_the_one_before_not_itself(data: DataSection) -> None:
    _record_all(data, {"ds=2026-01-01": "a", "ds=2026-01-02": "b"})
    assert history.previous(data, PIPELINE, "ds=2026-01-02")["digest"] == "a"


def test_recording_a_partition_again_replaces_its_record(data: DataSection) -> None:
    history.record(data, PIPELINE, "ds=2026-01-01", {"digest": "old", "rows": 1})
    history.record(data, PIPELINE, "ds=2026-01-01", {"digest": "new", "rows": 2})
    (only,) = history.records(data, PIPELINE)
    assert (only["digest"], only["rows"]) == ("new", 2)


def test_previous_of_a_nested_partition_is_the_latest_earlier_one(data: DataSection) -> None:
    _record_all(data, {"year=2025/month=12": "dec", "year=2026/month=01": "jan", "year=2026/month=03": "mar"})
    assert history.previous(data, PIPELINE, "year=2026/month=02")["digest"] == "jan"
    assert history.previous(data, PIPELINE, "year=2026/month=01")["digest"] == "dec"


def test_each_pipeline_has_its_own_history(data: DataSection) -> None:
    _record_all(data, {"ds=2026-01-01": "fraud"})
    _record_all(data, {"ds=2026-01-02": "other"}, pipeline="churn")
    assert history.previous(data, PIPELINE, "ds=2026-01-05")["digest"] == "fraud"
    assert history.by_digest(data, "churn", "fraud") is None


def test_the_same_data_under_two_partitions_matches_the_later_record(data: DataSection) -> None:
    _record_all(data, {"ds=2026-01-02": "same", "ds=2026-01-01": "same", "ds=2026-01-03": "other"})
    match = history.by_digest(data, PIPELINE, "same")
    assert (match["partition"], match["rows"]) == ("ds=2026-01-02", 0)


def test_a_relative_data_uri_keeps_its_history_under_trainpipe_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    uri = history.record(_data("data/cards"), PIPELINE, "ds=2026-01-01", {"digest": "a"})
    expected = (
        tmp_path / "home" / "data" / "cards" / "_trainpipe" / "validated" / PIPELINE / "ds=2026-01-01.json"
    )
    assert uri == f"file://{expected}" and expected.is_file()
    assert history.previous(_data("data/cards"), PIPELINE, "ds=2026-01-02")["digest"] == "a"
