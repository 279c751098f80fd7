"""What a trial task hands the study's result task, and what the result task hands `train`."""

from __future__ import annotations

from typing import Any, Literal

from airflow_trainpipe.contracts.payloads import Payload, TrainResult


class StudyRef(Payload):
    """tune_start's result: where the trials find their study."""

    study_name: str
    storage: str
    """The Optuna storage URL with its password masked; the tasks resolve the real one again."""
    parent_run_id: str
    """The study's MLflow run; each trial's run is its child."""
    run_id: str
    """The Airflow run (or the CLI's --run-id) the trials' run directories are scoped by."""


class RungReport(Payload):
    resource: int
    """Epochs (or steps) trained when the rung ended."""
    value: float
    """The objective on the validation split."""


class TrialOutcome(Payload):
    """One trial: its hyperparameters, each rung's objective, and how it ended."""

    number: int
    slot: int
    """The mapped task index that ran it (a rerun of that index finds this trial again)."""
    state: Literal["complete", "pruned", "failed", "not_started"]
    params: dict[str, Any]
    value: float | None
    """The objective at the last rung reached (the trial's value in the study)."""
    rungs: list[RungReport]
    compute_hours: float
    """Device-hours of every attempt of every rung (processes x wall time)."""
    full_budget_compute_hours: float | None
    """What this trial would have used at the full budget: its own rate times the full budget."""
    mlflow_run_id: str | None
    run_dir: str | None
    result: TrainResult | None = None
    """The full-budget rung's TrainResult (complete trials): the gate's candidate if it is the best."""


class TuningSummary(Payload):
    """The study at its end: the `tune` task's result and `trainpipe tune`'s last line."""

    study_name: str
    direction: Literal["maximize", "minimize"]
    metric: str
    trials: int
    complete: int
    pruned: int
    failed: int
    best_trial: int | None
    best: float | None
    best_params: dict[str, Any]
    compute_hours: float
    full_budget_compute_hours: float
    pruned_at_first_rung: int
    parent_run_id: str
    candidate: TrainResult | None
    """The best trial's full-budget result (None when nothing completed)."""

    def line(self, baseline: float | None) -> dict[str, Any]:
        """The CLI's last line."""
        return {
            "trials": self.trials,
            "pruned": self.pruned,
            "best": self.best,
            "baseline": baseline,
            "direction": self.direction,
            "compute_hours": round(self.compute_hours, 6),
            "full_budget_compute_hours": round(self.full_budget_compute_hours, 6),
        }
