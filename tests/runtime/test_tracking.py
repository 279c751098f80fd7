"""The embedded MLflow store keeps its artifacts next to its database, whatever the working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_trainpipe.runtime.tracking import Tracker, artifact_location


def test_a_tracking_server_chooses_its_own_artifact_location() -> None:
    assert artifact_location("http://127.0.0.1:5000", "fraud_detector") is None


def test_embedded_store_artifacts_stay_under_trainpipe_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.setenv("TRAINPIPE_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(elsewhere)
    tracker = Tracker(experiment="fraud_detector", run_dir=(tmp_path / "run").as_uri(), run_name="r", run_id=None, tags={})
    tracker.log_dict({"ok": True}, "probe.json")
    run = tracker.client.get_run(tracker.run_id)
    assert run.info.artifact_uri.startswith((home / "mlartifacts" / "fraud_detector").as_uri())
    assert (Path(run.info.artifact_uri.removeprefix("file://")) / "probe.json").is_file()
    assert os.listdir(elsewhere) == []
