"""What a trial task hands the study's result task, and what the result task hands `train`."""

from __future__ import annotations

from typing import Any, Literal

from airflow_trainpipe.contracts.payloads import Payload, RungValue, TrainResult


class StudyRef(Payload):
    """tune_start's result: where the trials find their study."""

    study_name: str
    storage: str
    """The Optuna storage URL with its password masked; the tasks resolve the real one again."""
    parent_run_id: str
    """The study's MLflow run; each trial's run is its child."""
    run_id: str
    """The Airflow run (or the CLI's --run-id) the trials' run directories are scoped by."""


RungReport = RungValue  # a rung's objective, as the job reported it


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
    """Device-hours of every attempt of its job (processes x wall time, start-up included)."""
    startup_compute_hours: float = 0.0
    """The part spent before first steps."""
    end_compute_hours: float = 0.0
    """The part spent after the last step (a complete trial's includes logging its model)."""
    study_compute_hours: float = 0.0
    """The part spent asking the study at rung ends (a job without rungs spends none)."""
    full_budget_compute_hours: float | None
    """What this trial would have used at the full budget without pruning: its start-up and end,
    and its own training rate times the full budget (its rung ends' study round trips left out)."""
    mlflow_run_id: str | None
    run_dir: str | None
    result: TrainResult | None = None
    """The full-budget rung's TrainResult (complete trials): the gate's candidate if it is the best."""
    ended_earlier: bool = False
    """Read back from the study: the trial had ended in an earlier run of the slot (a resumed
    study), and was not trained again."""


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
    """Device-hours of every trial's job, start-up and end included."""
    full_budget_compute_hours: float
    """The same trials at the full budget, estimated from each one's own start-up, training rate
    and the complete trials' end (what a pruned trial would have spent publishing)."""
    startup_compute_hours: float = 0.0
    """The part of `compute_hours` spent before first steps."""
    wall_s: float = 0.0
    """From the first trial's start to the last one's end, as the study's storage recorded them."""
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
            "startup_compute_hours": round(self.startup_compute_hours, 6),
            "wall_s": round(self.wall_s, 1),
        }
