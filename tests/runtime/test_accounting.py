"""The step high-water mark that survives a retry, and where an attempt's time went."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import fsspec
import pytest

from airflow_trainpipe.runtime.accounting import MARK_FILE, StepHighWater, Timing

UPLOADER = "step-high-water"


def _uploaders() -> int:
    return sum(thread.name == UPLOADER for thread in threading.enumerate())


@pytest.fixture
def remote_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A run directory in an object store (fsspec's in-memory one); this node's disk is tmp_path/node-a."""
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "node-a"))
    return f"memory://trainpipe-{tmp_path.name}/run"


def _stored_step(uri: str) -> int:
    fs, path = fsspec.core.url_to_fs(uri)
    return json.loads(fs.cat_file(path))["step"]


# -- StepHighWater -----------------------------------------------------------------------------


def test_a_run_that_never_stepped_has_high_water_zero(tmp_path: Path) -> None:
    assert StepHighWater(tmp_path.as_uri()).high_water() == 0


def test_a_local_run_directory_holds_the_newest_step_at_once_without_an_uploader(tmp_path: Path) -> None:
    threads_before = _uploaders()
    mark = StepHighWater(tmp_path.as_uri())
    for step in (1, 2, 17):
        mark.record(step)
    assert json.loads((tmp_path / MARK_FILE).read_text()) == {"step": 17}
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARK_FILE]  # written in place, no temporary file
    assert StepHighWater(tmp_path.as_uri()).high_water() == 17  # what the next attempt reads
    assert _uploaders() == threads_before


def test_a_new_attempt_overwrites_a_longer_mark_whole(tmp_path: Path) -> None:
    (tmp_path / MARK_FILE).write_text('{"step": 3, "written_by": "an older format, longer than a mark"}')
    mark = StepHighWater(tmp_path.as_uri())
    assert mark.high_water() == 3
    mark.record(4)
    assert json.loads((tmp_path / MARK_FILE).read_text()) == {"step": 4}


@pytest.mark.parametrize("text", ["", '{"step": 1', '{"steps": 4}', '{"step": "four"}'])
def test_an_unreadable_mark_counts_as_no_step_reached(tmp_path: Path, text: str) -> None:
    (tmp_path / MARK_FILE).write_text(text)
    assert StepHighWater(tmp_path.as_uri()).high_water() == 0


def test_a_remote_run_directory_gets_the_newest_step_for_a_pod_on_another_node(
    remote_run: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mark = StepHighWater(remote_run)
    assert mark.path.is_relative_to(tmp_path / "node-a" / "step_high_water")
    for step in range(1, 26):
        mark.record(step)
    mark.flush(timeout=10)
    assert _stored_step(f"{remote_run}/{MARK_FILE}") == 25
    assert json.loads(mark.path.read_text()) == {"step": 25}
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "node-b"))  # a new pod: nothing on its disk
    fresh = StepHighWater(remote_run)
    assert not fresh.path.exists() and fresh.high_water() == 25


@pytest.mark.parametrize(("stored", "expected"), [(12, 30), (50, 50)])
def test_the_higher_of_the_node_and_store_marks_wins(remote_run: str, stored: int, expected: int) -> None:
    mark = StepHighWater(remote_run)
    mark.record(30)
    mark.flush(timeout=10)
    fs, path = fsspec.core.url_to_fs(f"{remote_run}/{MARK_FILE}")
    fs.pipe_file(path, json.dumps({"step": stored}).encode())  # the store lags, or another node got further
    assert StepHighWater(remote_run).high_water() == expected


# -- Timing ------------------------------------------------------------------------------------


def _timing(seconds_ago: float, **kwargs: float) -> Timing:
    return Timing(
        first_step=40,
        earlier_compute_s=100.0,
        world_size=3,
        earlier_device_s=250.0,
        started=time.monotonic() - seconds_ago,
        **kwargs,
    )


def test_compute_time_adds_this_attempt_and_device_time_counts_every_process() -> None:
    timing = _timing(10.0)
    assert timing.compute_s() == pytest.approx(100.0 + 10.0, abs=0.5)
    assert timing.device_s() == pytest.approx(250.0 + 10.0 * 3, abs=1.5)


def test_measure_accumulates_into_the_named_field_even_when_the_block_fails() -> None:
    timing = _timing(0.0)
    with timing.measure("checkpoint_s"):
        time.sleep(0.05)
    with pytest.raises(RuntimeError, match="store down"), timing.measure("checkpoint_s"):
        time.sleep(0.05)
        raise RuntimeError("store down")
    assert 0.1 <= timing.checkpoint_s < 1.0
    assert timing.eval_s == 0.0 and timing.data_wait_s == 0.0


def test_the_summary_counts_this_attempts_steps_and_separates_evaluation_from_training() -> None:
    summary = _timing(10.0, eval_s=2.5, checkpoint_s=1.25, data_wait_s=0.5, study_s=0.75).summary(
        last_step=58
    )
    assert summary["steps"] == 18
    assert summary["loop_s"] == pytest.approx(10.0, abs=0.5)
    assert (
        summary["train_s"] == summary["loop_s"] - 2.5 - 0.75
    )  # a trial's study round trips are not training
    assert summary["study_s"] == 0.75
    assert (summary["checkpoint_s"], summary["eval_s"], summary["data_wait_s"]) == (1.25, 2.5, 0.5)
