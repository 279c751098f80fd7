"""The end of an epoch: score the validation split (or the holdout without one), keep the best,
decide whether to stop early."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_trainpipe.contracts.events import emit
from airflow_trainpipe.runtime.accounting import Timing
from airflow_trainpipe.runtime.tracking import Tracker


@dataclass(frozen=True)
class EpochEndConfig:
    metric: str
    """The gate's metric: the one the best checkpoint is chosen by."""

    higher_is_better: bool
    patience: int | None = None
    """`early_stopping_patience`: epochs without improvement before the run stops."""

    prefix: str = "holdout"
    """What the metrics are named after: `holdout`, or `validation` in a tuning trial."""


class EpochEnd:
    def __init__(
        self, cfg: EpochEndConfig, evaluate: Callable[[], dict[str, float]], tracker: Tracker | None
    ):
        self.cfg, self.evaluate, self.tracker = cfg, evaluate, tracker

    def run(self, state: dict[str, Any], epoch: int, step: int, timing: Timing) -> tuple[float, bool]:
        """Record the epoch's metrics in `state`; returns (the metric's value, stop now)."""
        with timing.measure("eval_s"):
            metrics = self.evaluate()
        state["history"].append({"epoch": epoch, "step": step, **metrics})
        value = metrics[self.cfg.metric]
        best = state["best"]
        improved = best is None or (value > best if self.cfg.higher_is_better else value < best)
        state["best"] = value if improved else best
        if improved:
            state["best_step"] = step  # training.restore_best loads this step's checkpoint at the end
        state["stale_epochs"] = 0 if improved else state["stale_epochs"] + 1
        if self.tracker is not None:
            named = {f"{self.cfg.prefix}_{k}": v for k, v in metrics.items()}
            self.tracker.log_metrics(named, step, flush=True)
            emit("epoch", epoch=epoch, step=step, **named)
        patience = self.cfg.patience
        return value, bool(patience and state["stale_epochs"] >= patience)
