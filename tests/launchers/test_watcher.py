"""JobWatcher: what it keeps from a job's output lines, and the exception a failed job becomes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from airflow.sdk.definitions.retry_policy import RetryDecision

from airflow_trainpipe.contracts.events import PREFIX
from airflow_trainpipe.core.exceptions import PayloadError, TrainingJobError
from airflow_trainpipe.core.retry_policy import TRAINPIPE_RETRY_POLICY
from airflow_trainpipe.launchers.watcher import JobWatcher

WHAT = "training job exited with code 1 (try 2)"
HINT = "a retry resumes from the newest complete checkpoint under s3://ckpt/run"
RESULT = {
    "final_step": 300,
    "final_train_loss": 0.25,
    "holdout_metrics": {"roc_auc": 0.9},
    "weights_sha256": "ab" * 32,
    "resumed_from_step": 0,
    "steps_recomputed": 0,
    "epochs_completed": 3,
    "stopped_early": False,
    "world_size": 2,
    "timing": {
        "steps": 300,
        "loop_s": 10,
        "train_s": 8,
        "checkpoint_s": 1,
        "eval_s": 0.5,
        "data_wait_s": 0.5,
    },
    "mlflow_run_id": "run42",
    "mlflow_experiment_id": "7",
    "transform_hash": "t" * 16,
    "evaluation": {"holdout_rows": 200, "candidate": {"roc_auc": 0.9}},
    "model_uri": "runs:/run42/model",
}


class Store(dict):
    """The part of Airflow's task_state_store the watcher writes to."""

    def set(self, key: str, value: object) -> None:
        self[key] = value


def _line(event: str, **fields: Any) -> str:
    return PREFIX + json.dumps({"event": event, **fields})


def _error(rank: int, error: str, **fields: Any) -> str:
    return _line("error", rank=rank, error=error, **fields)


def test_plain_lines_are_shown_and_only_the_last_ones_kept() -> None:
    watcher = JobWatcher(tail=3)
    shown = [watcher.feed(f"line {i}") for i in range(5)]
    assert shown == [f"line {i}" for i in range(5)]
    assert list(watcher.tail) == ["line 2", "line 3", "line 4"]


def test_with_show_raw_off_plain_lines_are_kept_but_not_shown() -> None:
    watcher = JobWatcher(show_raw=False)
    assert watcher.feed("[rank1] NCCL INFO init") is None
    assert list(watcher.tail) == ["[rank1] NCCL INFO init"]


@pytest.mark.parametrize(
    "line",
    [PREFIX + '{"event": "result", "final_step": 3', PREFIX + "not json", "TRAINPIPE{}", PREFIX.strip()],
)
def test_a_malformed_event_line_is_plain_output(line: str) -> None:
    watcher = JobWatcher()
    assert watcher.feed(line) == line
    assert list(watcher.tail) == [line] and watcher.result is None and watcher.errors == []


def test_an_event_after_another_ranks_unfinished_output_is_still_an_event() -> None:
    watcher = JobWatcher()
    shown = watcher.feed("[rank1] partial warning" + _error(1, "OOM"))
    assert shown == "training failed on rank 1: OOM"
    assert watcher.errors == ["rank 1: OOM"] and list(watcher.tail) == []


def test_the_result_event_becomes_a_typed_train_result() -> None:
    watcher = JobWatcher()
    shown = watcher.feed(_line("result", **RESULT))
    assert shown == f"training finished at step 300: weights sha256 {'ab' * 8}..., MLflow run run42"
    assert watcher.result is not None
    assert watcher.result.final_step == 300 and watcher.result.evaluation.candidate == {"roc_auc": 0.9}
    assert watcher.result.timing.loop_s == 10.0 and watcher.result.run_dir is None


def test_an_incomplete_result_event_names_itself_and_the_missing_field() -> None:
    watcher = JobWatcher()
    partial = {k: v for k, v in RESULT.items() if k != "weights_sha256"}
    with pytest.raises(PayloadError, match=r"^the job's result event is not a TrainResult: weights_sha256: "):
        watcher.feed(_line("result", **partial))


def test_a_start_without_an_mlflow_run_stores_nothing() -> None:
    store = Store()
    watcher = JobWatcher(store)
    watcher.feed(_line("start", total_steps=1, world_size=1, global_batch=1, train_rows=1, holdout_rows=1))
    assert store == {} and watcher.mlflow_run_id is None


def test_without_a_store_progress_is_still_followed() -> None:
    watcher = JobWatcher(store=None)
    watcher.feed(
        _line(
            "start",
            total_steps=1,
            world_size=1,
            global_batch=1,
            train_rows=1,
            holdout_rows=1,
            mlflow_run_id="r1",
        )
    )
    watcher.feed(_line("checkpoint", step=1, uri="file:///ckpt/step_1"))
    assert watcher.mlflow_run_id == "r1"


def test_one_non_retryable_error_makes_the_failure_final_whatever_follows() -> None:
    watcher = JobWatcher()
    watcher.feed(_error(0, "ChangedDataError: file changed", retryable=False))
    watcher.feed(_error(1, "RuntimeError: peer gone", retryable=True))
    assert watcher.final
    assert watcher.errors == ["rank 0: ChangedDataError: file changed", "rank 1: RuntimeError: peer gone"]


@pytest.mark.parametrize("line", ["plain text", _line("step", step=4)])
def test_the_log_formatter_always_returns_a_line(line: str) -> None:
    watcher = JobWatcher(show_raw=False)
    assert watcher.log_formatter("base", line) == line


def test_a_final_failure_is_not_retried_and_names_the_first_error() -> None:
    watcher = JobWatcher()
    watcher.feed(_error(3, "ChangedDataError: part-0 changed", retryable=False))
    watcher.feed(_error(0, "RuntimeError: later"))
    failure = watcher.failure(WHAT, HINT, cause=RuntimeError("ignored"))
    assert isinstance(failure, TrainingJobError) and failure.retryable is False
    assert str(failure) == f"{WHAT}, not retried: rank 3: ChangedDataError: part-0 changed"
    # The package's retry policy decides, as for every other error of ours (FOUND.md: the watcher
    # used to translate into Airflow exceptions by hand, beside the policy).
    assert TRAINPIPE_RETRY_POLICY.evaluate(failure, 1, 3) == RetryDecision.fail(
        reason="TrainingJobError is not retryable: another try would fail the same way"
    )


def test_a_retryable_failure_gives_the_error_the_hint_and_the_last_output() -> None:
    watcher = JobWatcher(tail=2)
    for line in ("loading", "step 1", _error(1, "RuntimeError: NCCL timeout"), "Traceback ..."):
        watcher.feed(line)
    failure = watcher.failure(WHAT, HINT, cause=RuntimeError("exit 1"))
    assert type(failure) is TrainingJobError and failure.retryable
    assert TRAINPIPE_RETRY_POLICY.evaluate(failure, 1, 3) == RetryDecision.retry(
        reason="TrainingJobError is retryable: another try can succeed"
    )
    assert (
        str(failure)
        == f"{WHAT}: rank 1: RuntimeError: NCCL timeout; {HINT}. Last output:\nstep 1\nTraceback ..."
    )


@pytest.mark.parametrize(
    ("cause", "reason"), [(ConnectionError("API server unreachable"), ": API server unreachable"), (None, "")]
)
def test_without_error_events_the_cause_is_the_reason(cause: BaseException | None, reason: str) -> None:
    watcher = JobWatcher()
    watcher.feed("Killed")
    failure = watcher.failure(WHAT, HINT, cause=cause)
    assert type(failure) is TrainingJobError and failure.retryable
    assert str(failure) == f"{WHAT}{reason}; {HINT}. Last output:\nKilled"


def test_a_preempted_job_fails_retryable_naming_the_checkpoint_it_resumes_from() -> None:
    store = Store()
    watcher = JobWatcher(store)
    shown = watcher.feed(
        _line(
            "preempted", step=11, checkpoint="s3://ckpt/run/checkpoints/step_000000011", signal_to_saved_s=0.4
        )
    )
    assert shown == (
        "preempted: stopped after step 11, checkpoint s3://ckpt/run/checkpoints/step_000000011 "
        "complete 0.4 s after SIGTERM"
    )
    assert store["checkpoint"] == {"step": 11, "uri": "s3://ckpt/run/checkpoints/step_000000011"}
    failure = watcher.failure("training job exited with code 1 (try 1)", HINT)
    assert type(failure) is TrainingJobError and failure.retryable  # Airflow's retries recover it
    assert str(failure) == (
        "training job exited with code 1 (try 1): preempted (SIGTERM) after step 11; checkpoint "
        "s3://ckpt/run/checkpoints/step_000000011 was complete 0.4 s after the signal, and the next "
        "try resumes from it"
    )


def test_an_error_after_a_preemption_notice_is_reported_as_the_error() -> None:
    watcher = JobWatcher()
    watcher.feed(_line("preempted", step=11, checkpoint="file:///c/step_000000011", signal_to_saved_s=0.4))
    watcher.feed(_error(1, "RuntimeError: peer gone"))
    assert "RuntimeError: peer gone" in str(watcher.failure(WHAT, HINT))
