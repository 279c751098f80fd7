"""launchers/runner.py: the one place a training job is placed, started and followed to its end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_trainpipe.core.exceptions import TrainingJobError
from airflow_trainpipe.launchers.forked import ForkedLauncher
from airflow_trainpipe.launchers.local import LocalLauncher
from airflow_trainpipe.launchers.runner import Placement, TrainingJob, labels_for, run_training, stored_result
from tests.helpers.jobs import make_spec

FILES = ["file:///data/part-0.parquet"]


@pytest.mark.parametrize(
    ("nproc", "fork", "gpus", "launcher"),
    [
        (1, True, 0, ForkedLauncher),
        (2, True, 0, ForkedLauncher),
        (1, False, 0, LocalLauncher),
        (2, False, 0, LocalLauncher),
        # A GPU job is never forked (its warm parent may hold CUDA): the torchrun command runs it.
        (1, True, 1, LocalLauncher),
    ],
)
def test_only_a_cpu_job_placed_to_fork_is_forked(
    tmp_path: Path, nproc: int, fork: bool, gpus: int, launcher: type
) -> None:
    spec = make_spec(tmp_path, FILES, "r")
    config = spec.config.model_copy(
        update={
            "training": spec.config.training.model_copy(
                update={
                    "resources": spec.config.training.resources.model_copy(update={"gpus_per_node": gpus})
                }
            )
        }
    )
    job = TrainingJob(spec.model_copy(update={"config": config}), Placement(nproc=nproc, fork=fork))
    assert type(job.launcher()) is launcher
    assert job.launcher().nproc == nproc


def test_the_try_number_reaches_the_ranks_and_the_failure_message(tmp_path: Path) -> None:
    placement = Placement(nproc=1, env={"A": "1"}, try_number=3)
    assert placement.job_env() == {"A": "1", "TRAINPIPE_TRY_NUMBER": "3"}
    assert placement.attempt() == " (try 3)" and Placement().attempt() == ""
    assert TrainingJob(make_spec(tmp_path, FILES, "r"), Placement()).nproc == 2  # the config's


def test_a_trials_pods_are_named_after_its_run_and_budget_not_the_shared_task(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, FILES, "r")
    assert labels_for(spec, "d", "train", "manual__1", 2).run_id == "manual__1"


def test_a_result_the_output_did_not_carry_is_read_from_result_json(tmp_path: Path) -> None:
    with pytest.raises(TrainingJobError, match=r"result\.json does not exist"):
        stored_result(tmp_path.as_uri())
    (tmp_path / "result.json").write_text(json.dumps({"final_step": 3}))
    with pytest.raises(Exception, match=r"result\.json"):  # a payload that is not a TrainResult is named
        stored_result(tmp_path.as_uri())


@pytest.mark.slow
def test_a_job_that_fails_raises_its_exit_code_the_ranks_error_and_whether_to_retry(
    tmp_path: Path, trainpipe_home: Path
) -> None:
    not_parquet = tmp_path / "part-00000.parquet"
    not_parquet.write_text("this is not a parquet file")
    spec = make_spec(tmp_path, [not_parquet.as_uri()], "bad_bytes")
    shown: list[str] = []
    with pytest.raises(TrainingJobError) as caught:
        run_training(spec, Placement(nproc=1, try_number=1), on_line=shown.append)
    error = caught.value
    assert error.exit_code not in (None, 0) and error.retryable is False  # bad data: no retry helps
    assert str(error).startswith("training job exited with code") and "(try 1) [bad_bytes]" in str(error)
    assert "DataError: cannot read" in str(error)
    assert any("training failed on rank 0" in line for line in shown)
