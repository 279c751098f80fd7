"""The worker's side without Feast: which interpreter it runs, and a child that crashes."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import pytest

from airflow_trainpipe.data.feature_store import client
from airflow_trainpipe.data.feature_store.client import FeatureStoreError
from airflow_trainpipe.data.sources.errors import SourceError


def test_the_interpreter_is_the_configured_one_else_the_environment_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRAINPIPE_FEAST_PYTHON", sys.executable)
    assert client.feast_python() == sys.executable
    assert client.feast_python("/bin/sh") == "/bin/sh"


def test_no_interpreter_or_a_wrong_one_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TRAINPIPE_FEAST_PYTHON")
    with pytest.raises(FeatureStoreError) as caught:
        client.feast_python()
    assert isinstance(caught.value, SourceError) and caught.value.kind == "no_feast_python"
    assert "TRAINPIPE_FEAST_PYTHON is not set" in str(caught.value) and "make venv" in str(caught.value)
    assert "feast[duckdb]==0.67.0" in str(caught.value) and "constraints-feast.txt" in str(caught.value)
    (tmp_path / "python").write_text("")
    for wrong in (tmp_path / "missing", tmp_path / "python"):  # absent; not executable
        with pytest.raises(FeatureStoreError, match=f"Feast interpreter {wrong} is not an executable file"):
            client.feast_python(str(wrong))


def test_a_child_that_crashes_reports_its_exit_code_and_stderr(tmp_path: Path) -> None:
    # The workers' own interpreter has no feast: the child fails to import it.
    with pytest.raises(FeatureStoreError) as caught:
        client.materialize(
            python=sys.executable,
            repo=tmp_path,
            feature_views=["card_activity"],
            end=datetime(2026, 1, 2),
            cover_from=datetime(2026, 1, 1),
        )
    assert caught.value.kind == "child_crashed" and not caught.value.retryable
    assert "of materialize exited with code 1" in str(caught.value)
    assert "No module named 'feast'" in str(caught.value)


def test_features_or_a_feature_service_not_both(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="either features or feature_service"):
        client.retrieve(
            python=sys.executable,
            repo=tmp_path,
            entity_files=[],
            timestamp_column="t",
            output=tmp_path / "o",
            features=["a:b"],
            feature_service="s",
        )
