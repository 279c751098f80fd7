"""The one-line descriptions of the training job's events, and which events stay silent."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_trainpipe.launchers.display import _duration, describe


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0m00s"),
        (59.4, "0m59s"),
        (59.6, "1m00s"),
        (754, "12m34s"),
        (3600, "1h00m00s"),
        (93784, "26h03m04s"),
    ],
)
def test_durations_are_rounded_to_seconds_with_hours_only_when_needed(seconds: float, text: str) -> None:
    assert _duration(seconds) == text


START = {
    "event": "start",
    "total_steps": 300,
    "world_size": 4,
    "global_batch": 1024,
    "train_rows": 80000,
    "holdout_rows": 20000,
    "resumed_from": 0,
    "steps_recomputed": 0,
}


@pytest.mark.parametrize(
    ("event", "line"),
    [
        (
            START,
            "training started: 300 steps on 4 rank(s), global batch 1024, 80000 training / 20000 holdout rows",
        ),
        (
            {"event": "progress", "step": 75, "total_steps": 300, "epoch": 2, "loss": 0.123456}
            | {"samples_per_s": 12345.6, "eta_s": 3725},
            "step 75/300 (25%) epoch 2 loss 0.1235 | 12,346 samples/s | ETA 1h02m05s",
        ),
        (
            {"event": "epoch", "epoch": 1, "step": 100, "holdout_roc_auc": 0.91234, "train_loss": 0.3}
            | {"holdout_log_loss": 0.2},
            "epoch 1 done at step 100: holdout roc_auc=0.9123, log_loss=0.2000",
        ),
        (
            {"event": "result", "final_step": 300, "weights_sha256": "0123456789abcdef" + "f" * 48}
            | {"mlflow_run_id": "run42"},
            "training finished at step 300: weights sha256 0123456789abcdef..., MLflow run run42",
        ),
        (
            {"event": "result", "final_step": 300, "weights_sha256": "0123456789abcdef" + "f" * 48}
            | {"mlflow_run_id": "run42", "weights_step": 200},
            "training finished at step 300: weights sha256 0123456789abcdef... (the best epoch's weights, "
            "of step 200), MLflow run run42",
        ),
        (
            START | {"validation_rows": 8000},
            "training started: 300 steps on 4 rank(s), global batch 1024, 80000 training / 8000 validation / "
            "20000 holdout rows",
        ),
        (
            START
            | {"dtype": "bfloat16"}
            | {
                "speed": {
                    "fused_optimizer": True,
                    "attention": "sdpa",
                    "compiled": True,
                    "group_by_length": False,
                }
            },
            "training started: 300 steps on 4 rank(s), global batch 1024, 80000 training / 20000 holdout rows; "
            "bfloat16, fused AdamW, sdpa attention, compiled",
        ),
        (
            {"event": "error", "rank": 2, "error": "ValueError: bad batch"},
            "training failed on rank 2: ValueError: bad batch",
        ),
    ],
    ids=[
        "start",
        "progress",
        "epoch",
        "result",
        "best_result",
        "start_with_validation",
        "start_with_speed",
        "error",
    ],
)
def test_each_event_kind_has_its_line(event: dict[str, Any], line: str) -> None:
    assert describe(event) == line


def test_a_start_at_step_zero_is_not_shown_as_a_resume() -> None:
    assert "resuming" not in describe(START)
    resumed = describe({**START, "resumed_from": 120, "steps_recomputed": 20})
    assert resumed.endswith("holdout rows, resuming from step 120 (20 step(s) to recompute)")


def test_the_start_line_says_what_the_engine_runs() -> None:
    speed = {
        "fused_optimizer": True,
        "attention": "sdpa",
        "compiled": False,
        "fused_qkv": True,
        "packing": True,
    }
    line = describe({**START, "dtype": "bfloat16", "speed": speed})
    assert line is not None and line.endswith(
        "; bfloat16, fused AdamW, sdpa attention, fused QKV, packed text"
    )
    assert describe({**START, "speed": {"fused_optimizer": False}}).endswith("holdout rows; AdamW")  # type: ignore[union-attr]


def test_progress_percentage_is_of_the_total_steps() -> None:
    line = describe(
        {
            "event": "progress",
            "step": 1,
            "total_steps": 3,
            "epoch": 0,
            "loss": 1,
            "samples_per_s": 9,
            "eta_s": 0,
        }
    )
    assert line == "step 1/3 (33%) epoch 0 loss 1.0000 | 9 samples/s | ETA 0m00s"


@pytest.mark.parametrize("event", [{"event": "step", "step": 3}, {"event": "heartbeat"}, {"step": 3}, {}])
def test_per_step_noise_and_unknown_events_are_silent(event: dict[str, Any]) -> None:
    assert describe(event) is None
