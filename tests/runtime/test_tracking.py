"""The embedded MLflow store keeps its artifacts next to its database, whatever the working directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airflow_trainpipe.runtime.tracking import Tracker, artifact_location


def test_a_tracking_server_chooses_its_own_artifact_location() -> None:
    assert artifact_location("http://127.0.0.1:5000", "fraud_detector") is None


def test_embedded_store_artifacts_stay_under_trainpipe_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.setenv("TRAINPIPE_HOME", str(home))
    # Empty means unset to the Tracker; setenv (not delenv) makes the teardown remove the URI that
    # mlflow.set_tracking_uri exports, which would otherwise leak into every later job of the session.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    monkeypatch.chdir(elsewhere)
    tracker = Tracker(
        experiment="fraud_detector", run_dir=(tmp_path / "run").as_uri(), run_name="r", run_id=None, tags={}
    )
    tracker.log_dict({"ok": True}, "probe.json")
    run = tracker.client.get_run(tracker.run_id)
    assert run.info.artifact_uri.startswith((home / "mlartifacts" / "fraud_detector").as_uri())
    assert (Path(run.info.artifact_uri.removeprefix("file://")) / "probe.json").is_file()
    assert os.listdir(elsewhere) == []


@pytest.mark.slow
def test_a_job_that_fails_marks_its_mlflow_run_failed(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    from mlflow import MlflowClient

    from airflow_trainpipe.runtime.tracking import RUN_ID_FILE
    from airflow_trainpipe.storage import local_path
    from tests.helpers.jobs import make_spec, run_job

    spec = make_spec(tmp_path, job_files, "fails_at_first_checkpoint")
    run_dir = local_path(spec.run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoints").write_text("a file where the checkpoint folder goes: the first save fails")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = run_job(spec, env={"MLFLOW_TRACKING_URI": store})
    assert run.code != 0 and "FileExistsError" in run.text, run.text[-3000:]
    run_id = json.loads((run_dir / RUN_ID_FILE).read_text())["run_id"]
    assert MlflowClient(store).get_run(run_id).info.status == "FAILED"


@pytest.mark.slow
def test_compute_hours_count_the_world_size_the_job_ran_with(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    from tests.helpers.jobs import make_spec, run_job

    spec = make_spec(tmp_path, job_files, "one_rank").limited_to(12)
    assert spec.config.training.resources.nproc_per_node == 2  # the config says 2; this job runs on 1
    run = run_job(spec, nproc=1)
    assert run.code == 0, run.text[-3000:]
    device_seconds = run.result["compute_hours_cpu"] * 3600
    assert device_seconds == pytest.approx(run.result["timing"]["loop_s"] * 1, rel=0.02)
