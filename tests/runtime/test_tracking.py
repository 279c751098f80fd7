"""The embedded MLflow store keeps its artifacts next to its database, whatever the working directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airflow_trainpipe.core.tracking_store import artifact_location
from airflow_trainpipe.runtime.tracking import Tracker


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


def _tracker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Tracker:
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # see above: unset, and nothing leaks
    return Tracker(experiment="e", run_dir=(tmp_path / "run").as_uri(), run_name="r", run_id=None, tags={})


def _recording_batches(tracker: Tracker, fail_in_background: bool = False) -> list[str]:
    import threading

    writers: list[str] = []
    log_batch = tracker.client.log_batch

    def recording(*args, **kwargs):
        writers.append(threading.current_thread().name)
        if fail_in_background and writers[-1] != "MainThread":
            raise RuntimeError("the tracking store went away")
        return log_batch(*args, **kwargs)

    tracker.client.log_batch = recording  # type: ignore[method-assign]
    return writers


def test_full_metric_batches_are_written_off_the_training_thread_and_all_are_stored_by_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = _tracker(tmp_path, monkeypatch)
    writers = _recording_batches(tracker)
    for step in range(1, 451):
        tracker.log_metrics({"train_loss": 1 / step}, step)
    tracker.finish("FINISHED")
    assert writers == [
        "mlflow-metrics_0",
        "mlflow-metrics_0",
        "MainThread",
    ]  # 200 + 200 in the background, 50 at the end
    history = tracker.client.get_metric_history(tracker.run_id, "train_loss")
    assert sorted((m.step, m.value) for m in history) == [(s, 1 / s) for s in range(1, 451)]
    assert tracker.client.get_run(tracker.run_id).info.status == "FINISHED"


def test_a_failed_background_batch_raises_on_the_training_thread_and_the_run_still_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = _tracker(tmp_path, monkeypatch)
    _recording_batches(tracker, fail_in_background=True)
    for step in range(1, 201):
        tracker.log_metrics({"train_loss": 1.0}, step)
    with pytest.raises(RuntimeError, match="the tracking store went away"):
        tracker.flush()
    tracker.fail()
    assert tracker.client.get_run(tracker.run_id).info.status == "FAILED"


@pytest.mark.slow
def test_a_job_that_fails_marks_its_mlflow_run_failed(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    from mlflow import MlflowClient

    from airflow_trainpipe.core.storage import local_path
    from airflow_trainpipe.runtime.tracking import RUN_ID_FILE
    from tests.helpers.jobs import make_spec, run_job

    spec = make_spec(tmp_path, job_files, "fails_at_first_checkpoint")
    run_dir = local_path(spec.run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "checkpoints").write_text("a file where the checkpoint folder goes: the first save fails")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = run_job(spec, 1, env={"MLFLOW_TRACKING_URI": store}, forked=True)  # the ranks are not the subject
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
    run = run_job(spec, nproc=1, forked=True)  # one rank, as `trainpipe tune` forks a CPU trial
    assert run.code == 0, run.text[-3000:]
    assert run.result["world_size"] == 1
    device_seconds = run.result["compute_hours_cpu"] * 3600
    timing = run.result["timing"]
    ran = timing["startup_s"] + timing["loop_s"] + timing["end_s"]  # start-up and end are device time too
    assert device_seconds == pytest.approx(ran * 1, rel=0.02)
    assert run.result["startup_compute_hours"] * 3600 == pytest.approx(timing["startup_s"] * 1, rel=1e-6)


@pytest.mark.parametrize(
    ("uri", "kind"),
    [
        ("file:///data/ds=2026-01-01", "LocalArtifactDatasetSource"),
        ("s3://b/ds=1", "S3ArtifactDatasetSource"),
    ],
)
def test_a_snapshots_dataset_source_is_named_without_mlflows_ambiguity_warning(uri: str, kind: str) -> None:
    import warnings

    from airflow_trainpipe.runtime.tracking import dataset_source

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "can be interpreted in multiple ways", in every job's log before
        source = dataset_source(uri)
    assert type(source).__name__ == kind and source.uri == uri


def test_two_runs_logging_one_snapshot_at_once_both_record_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parallel trials log the same snapshot. MLflow's store looks the dataset up, then inserts it:
    the other job's insert lands in between here (forced at our INSERT, on the real SQLite store),
    which failed one trial of `trainpipe tune --max-parallel 2` with a UNIQUE constraint error."""
    from sqlalchemy import event

    ours = _tracker(tmp_path, monkeypatch)
    theirs = Tracker(
        experiment="e", run_dir=(tmp_path / "run2").as_uri(), run_name="r2", run_id=None, tags={}
    )
    engine = ours.client._tracking_client.store.engine
    raced: list[str] = []

    def the_other_job_inserts_first(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO DATASETS") and not raced:
            raced.append(statement)
            theirs.log_data_input("fraud-snapshot", "file:///data/ds=2026-01-02", "sha256:" + "ab" * 32)

    event.listen(engine, "before_cursor_execute", the_other_job_inserts_first)
    try:
        ours.log_data_input("fraud-snapshot", "file:///data/ds=2026-01-02", "sha256:" + "ab" * 32)
    finally:
        event.remove(engine, "before_cursor_execute", the_other_job_inserts_first)
    assert raced  # the interleaving happened
    for tracker in (ours, theirs):
        inputs = tracker.client.get_run(tracker.run_id).inputs.dataset_inputs
        assert [(i.dataset.name, i.dataset.digest) for i in inputs] == [("fraud-snapshot", "ab" * 18)]
