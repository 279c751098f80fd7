"""openlineage.naming and core.storage.dataset_name: OpenLineage's names of our datasets."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_trainpipe.core.storage import dataset_name
from airflow_trainpipe.openlineage.naming import model_version_name, run_model_name, tracking_namespace


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("file:///srv/data/ds=2026-01-02", ("file", "/srv/data/ds=2026-01-02")),
        ("file:///srv/data/with%20space", ("file", "/srv/data/with space")),
        ("s3://lake/fraud/ds=2026-01-02", ("s3://lake", "fraud/ds=2026-01-02")),
        ("gs://bucket/a/b", ("gs://bucket", "/a/b")),
    ],
)
def test_storage_paths_are_named_as_the_spec_names_them(uri: str, expected: tuple[str, str]) -> None:
    assert dataset_name(uri) == expected


def test_a_relative_path_is_named_where_it_lies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path))
    assert dataset_name("data/fraud") == ("file", str(tmp_path / "data" / "fraud"))


@pytest.mark.parametrize(
    ("uri", "namespace"),
    [
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("https://alice:s3cret@mlflow.example.com/", "https://mlflow.example.com"),
        ("https://mlflow.example.com/tracking/", "https://mlflow.example.com/tracking"),
        ("sqlite:////srv/mlflow.db", "sqlite:////srv/mlflow.db"),
    ],
)
def test_the_tracking_server_is_the_namespace_without_its_credentials(uri: str, namespace: str) -> None:
    assert tracking_namespace(uri) == namespace


def test_models_and_versions_are_named_under_the_server() -> None:
    assert run_model_name("0a1b") == "runs/0a1b/model"
    assert model_version_name("fraud_detector", "3") == "models/fraud_detector/versions/3"
