"""The end of an epoch: history, the best holdout value, the stale-epoch count and early stopping."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from airflow_trainpipe.contracts.events import parse
from airflow_trainpipe.runtime.accounting import Timing
from airflow_trainpipe.runtime.epochs import EpochEnd, EpochEndConfig

if TYPE_CHECKING:
    from airflow_trainpipe.runtime.tracking import Tracker


def _scores(metric: str, values: list[float]) -> Callable[[], dict[str, float]]:
    """An evaluation that returns the next holdout score on each call, with a second metric beside it."""
    pending: Iterator[float] = iter(values)

    def evaluate() -> dict[str, float]:
        value = next(pending)
        return {metric: value, "other": value * 10}

    return evaluate


def _fresh_state() -> dict[str, Any]:
    return {"history": [], "best": None, "stale_epochs": 0}


def _run_epochs(
    cfg: EpochEndConfig, values: list[float]
) -> tuple[dict[str, Any], list[tuple[float, bool, float | None, int]]]:
    """Epochs of 19 steps; per epoch: the returned (value, stop) and the state's (best, stale)."""
    end, state, timing = EpochEnd(cfg, _scores(cfg.metric, values), None), _fresh_state(), Timing(0, 0.0)
    seen = []
    for epoch in range(len(values)):
        value, stop = end.run(state, epoch, (epoch + 1) * 19, timing)
        seen.append((value, stop, state["best"], state["stale_epochs"]))
    return state, seen


@pytest.mark.parametrize(
    ("cfg", "values", "bests", "stale", "stops"),
    [
        pytest.param(
            EpochEndConfig("roc_auc", higher_is_better=True, patience=2),
            [0.70, 0.80, 0.75, 0.80],  # an equal value is no improvement
            [0.70, 0.80, 0.80, 0.80],
            [0, 0, 1, 2],
            [False, False, False, True],
            id="maximize",
        ),
        pytest.param(
            EpochEndConfig("log_loss", higher_is_better=False, patience=2),
            [0.50, 0.60, 0.40, 0.45, 0.30],  # an improvement resets the stale count
            [0.50, 0.50, 0.40, 0.40, 0.30],
            [0, 1, 0, 1, 0],
            [False, False, False, False, False],
            id="minimize",
        ),
        pytest.param(
            EpochEndConfig("rmse", higher_is_better=False, patience=None),
            [1.0, 2.0, 3.0, 4.0, 5.0],
            [1.0, 1.0, 1.0, 1.0, 1.0],
            [0, 1, 2, 3, 4],
            [False] * 5,
            id="no-patience-never-stops",
        ),
    ],
)
def test_best_value_stale_epochs_and_the_stop_decision_follow_the_metric_direction(
    cfg: EpochEndConfig, values: list[float], bests: list[float], stale: list[int], stops: list[bool]
) -> None:
    _, seen = _run_epochs(cfg, values)
    assert seen == list(zip(values, stops, bests, stale, strict=True))


def test_patience_counts_epochs_without_improvement_from_the_last_best() -> None:
    cfg = EpochEndConfig("roc_auc", higher_is_better=True, patience=3)
    _, seen = _run_epochs(cfg, [0.9, 0.8, 0.8, 0.7, 0.6])
    assert [stop for _, stop, _, _ in seen] == [False, False, False, True, True]


def test_every_epoch_appends_its_step_and_all_holdout_metrics_to_the_history() -> None:
    state, _ = _run_epochs(EpochEndConfig("pr_auc", higher_is_better=True), [0.25, 0.5])
    assert state["history"] == [
        {"epoch": 0, "step": 19, "pr_auc": 0.25, "other": 2.5},
        {"epoch": 1, "step": 38, "pr_auc": 0.5, "other": 5.0},
    ]


def test_a_resumed_state_keeps_its_best_and_stale_count() -> None:
    end = EpochEnd(EpochEndConfig("r2", higher_is_better=True, patience=2), _scores("r2", [0.4]), None)
    state = {"history": [{"epoch": 0, "step": 19, "r2": 0.5}], "best": 0.5, "stale_epochs": 1}
    assert end.run(state, 1, 38, Timing(0, 0.0)) == (0.4, True)
    assert (state["best"], state["stale_epochs"], len(state["history"])) == (0.5, 2, 2)


def test_the_evaluation_time_is_counted_as_eval_time() -> None:
    def slow() -> dict[str, float]:
        time.sleep(0.05)
        return {"mae": 1.0}

    timing = Timing(0, 0.0)
    EpochEnd(EpochEndConfig("mae", higher_is_better=False), slow, None).run(_fresh_state(), 0, 5, timing)
    assert 0.05 <= timing.eval_s < 1.0 and timing.checkpoint_s == 0.0


def test_rank_zero_logs_the_holdout_metrics_and_announces_the_epoch(
    tracker: Tracker, capfd: pytest.CaptureFixture[str]
) -> None:
    end = EpochEnd(EpochEndConfig("roc_auc", higher_is_better=True), _scores("roc_auc", [0.75]), tracker)
    end.run(_fresh_state(), 2, 57, Timing(0, 0.0))
    history = tracker.client.get_metric_history(tracker.run_id, "holdout_roc_auc")
    assert [(m.step, m.value) for m in history] == [(57, 0.75)]  # flushed at once
    assert tracker.client.get_metric_history(tracker.run_id, "holdout_other")[0].value == 7.5
    events = [e for e in map(parse, capfd.readouterr().out.splitlines()) if e]
    assert events == [
        {"event": "epoch", "epoch": 2, "step": 57, "holdout_roc_auc": 0.75, "holdout_other": 7.5}
    ]
