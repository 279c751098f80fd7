"""The study's end: its summary, the best trial as the candidate, and the MLflow parent run."""

from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.contracts.tags import (
    BEST_TRIAL_TAG,
    ROLE_TAG,
    STUDY_TAG,
    TRIAL_RUNGS_TAG,
    TRIAL_STATE_TAG,
)
from airflow_trainpipe.tuning.outcomes import StudyRef, TrialOutcome, TuningSummary
from airflow_trainpipe.tuning.trials import stored_outcome

if TYPE_CHECKING:
    import optuna
    from mlflow import MlflowClient

log = logging.getLogger(__name__)


def summarize(study: optuna.Study, ref: StudyRef, warm_parent_s: float = 0.0) -> TuningSummary:
    """Read from the study itself (the storage is the record, not the tasks' XComs).

    `warm_parent_s`: start-up the trials' jobs shared (the process they were forked from,
    launchers/forked.py): one process's, once, in the study's device-hours and wall time and in
    its estimate at full budget, which would have forked its jobs the same way."""
    shared = warm_parent_s / 3600
    outcomes = [stored_outcome(t) for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    complete = [o for o in outcomes if o.state == "complete" and o.value is not None]
    maximize = study.direction.name == "MAXIMIZE"
    best: TrialOutcome | None = (
        (max if maximize else min)(complete, key=lambda o: o.value if o.value is not None else 0.0)
        if complete
        else None
    )
    return TuningSummary(
        study_name=ref.study_name,
        direction="maximize" if maximize else "minimize",
        metric=str(study.user_attrs.get("metric", "")),
        trials=len(outcomes),
        complete=len(complete),
        pruned=sum(o.state == "pruned" for o in outcomes),
        failed=sum(o.state == "failed" for o in outcomes),
        best_trial=best.number if best else None,
        best=best.value if best else None,
        best_params=best.params if best else {},
        compute_hours=shared + sum(o.compute_hours for o in outcomes),
        full_budget_compute_hours=shared + _full_budget(outcomes),
        startup_compute_hours=shared + sum(o.startup_compute_hours for o in outcomes),
        wall_s=warm_parent_s + _wall_s(study),
        pruned_at_first_rung=sum(o.state == "pruned" and len(o.rungs) == 1 for o in outcomes),
        parent_run_id=ref.parent_run_id,
        candidate=best.result if best else None,
    )


def _full_budget(outcomes: list[TrialOutcome]) -> float:
    """Every trial at the full budget: a trial that stopped early would also have paid a complete
    trial's end (its model logged and compared), which its own end did not."""
    ends = [o.end_compute_hours for o in outcomes if o.state == "complete"]
    complete_end = sum(ends) / len(ends) if ends else 0.0
    total = 0.0
    for o in outcomes:
        full = o.full_budget_compute_hours or o.compute_hours
        total += full if o.state == "complete" else full - o.end_compute_hours + complete_end
    return total


def _wall_s(study: optuna.Study) -> float:
    trials = [t for t in study.get_trials(deepcopy=False) if t.datetime_start and t.datetime_complete]
    if not trials:
        return 0.0
    started = min(t.datetime_start for t in trials if t.datetime_start)
    ended = max(t.datetime_complete for t in trials if t.datetime_complete)
    return (ended - started).total_seconds()


def start_parent_run(
    client: MlflowClient, experiment: str, ref_name: str, tags: dict[str, str], tracking_uri: str
) -> str:
    """The study's MLflow run (each trial's run is its child), created once per study."""
    from airflow_trainpipe.core.tracking_store import experiment_id_of

    # Where the training jobs would put it: an embedded store keeps artifacts beside its database.
    experiment_id = experiment_id_of(client, experiment, tracking_uri)
    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{STUDY_TAG}` = '{ref_name}' and tags.`{ROLE_TAG}` = 'study'",
    )
    if found:
        return str(found[0].info.run_id)
    run = client.create_run(
        experiment_id,
        run_name=f"study {ref_name}",
        tags={**tags, STUDY_TAG: ref_name, ROLE_TAG: "study"},
    )
    return str(run.info.run_id)


def tag_trial_run(client: MlflowClient, outcome: TrialOutcome) -> None:
    """Whether the trial was pruned, and at which rung, on its own MLflow run."""
    if outcome.mlflow_run_id is None:
        return
    client.set_tag(outcome.mlflow_run_id, TRIAL_STATE_TAG, outcome.state)
    client.set_tag(outcome.mlflow_run_id, TRIAL_RUNGS_TAG, str(len(outcome.rungs)))
    for rung in outcome.rungs:
        client.log_metric(outcome.mlflow_run_id, "objective", rung.value, step=rung.resource)


def log_study(client: MlflowClient, study: optuna.Study, summary: TuningSummary) -> None:
    """Best parameters, counts and compute on the parent run, with the study's plots; then end it."""
    run_id = summary.parent_run_id
    client.log_batch(
        run_id,
        params=_params({f"best.{k}": v for k, v in summary.best_params.items()}),
        metrics=_metrics(summary),
    )
    client.set_tag(run_id, BEST_TRIAL_TAG, str(summary.best_trial))
    with tempfile.TemporaryDirectory() as folder:
        for name, draw in _plots().items():
            path = Path(folder) / f"{name}.png"
            try:
                with warnings.catch_warnings():  # Optuna marks its matplotlib plots experimental
                    warnings.simplefilter("ignore")
                    figure = draw(study).get_figure()
                figure.savefig(path, dpi=100, bbox_inches="tight")
            except (ValueError, RuntimeError) as exc:  # e.g. importances need two complete trials
                log.warning("the %s plot of study %s was not drawn: %s", name, summary.study_name, exc)
                continue
            client.log_artifact(run_id, str(path), "study")
    client.set_terminated(run_id, "FINISHED")


def _plots() -> dict[str, Any]:
    import matplotlib

    matplotlib.use("Agg")  # no display on workers
    from optuna.visualization import matplotlib as plots

    return {
        "optimization_history": plots.plot_optimization_history,
        "param_importances": plots.plot_param_importances,
        "intermediate_values": plots.plot_intermediate_values,
    }


def _params(values: dict[str, Any]) -> list[Any]:
    from mlflow.entities import Param

    return [Param(k, str(v)[:6000]) for k, v in sorted(values.items())]


def _metrics(summary: TuningSummary) -> list[Any]:
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    values = {
        "trials": summary.trials,
        "complete": summary.complete,
        "pruned": summary.pruned,
        "pruned_at_first_rung": summary.pruned_at_first_rung,
        "failed": summary.failed,
        "compute_hours": summary.compute_hours,
        "full_budget_compute_hours": summary.full_budget_compute_hours,
        "startup_compute_hours": summary.startup_compute_hours,
        "compute_vs_full_budget": (
            summary.compute_hours / summary.full_budget_compute_hours
            if summary.full_budget_compute_hours
            else 1.0
        ),
        "wall_s": summary.wall_s,
        **({f"best_{summary.metric}": summary.best} if summary.best is not None else {}),
    }
    return [Metric(k, float(v), now, 0) for k, v in values.items()]
