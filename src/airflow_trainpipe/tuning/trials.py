"""One trial of the study: one run of the pipeline's training job through all of its rungs.

The job reports each rung's objective to the study and asks its pruner (runtime.rungs); it stops
itself when pruned, so a trial pays one job start, not one per rung. Its outcome is told to the
study here. A trial belongs to a slot (the mapped task index, or the CLI's loop index): a slot
that runs again finds its trial in the study. A finished trial is returned as it ended, never
trained again; a trial whose task died mid-rung keeps its hyperparameters and its run directory,
so the retry's job resumes from the newest complete checkpoint.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.config import PipelineConfig
from airflow_trainpipe.config.data import ValidationSplit
from airflow_trainpipe.config.training import Hyperparameters
from airflow_trainpipe.config.tuning import TuningSection
from airflow_trainpipe.contracts.payloads import TrainResult
from airflow_trainpipe.contracts.tags import STUDY_TAG, TRIAL_TAG
from airflow_trainpipe.contracts.train_spec import TrainSpec, TrialRung
from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.runtime.rungs import report_once
from airflow_trainpipe.tuning.outcomes import RungReport, StudyRef, TrialOutcome
from airflow_trainpipe.tuning.study import sampler, suggest, trial_hyperparameters

if TYPE_CHECKING:
    import optuna

Launch = Callable[[TrainSpec], TrainResult]
"""Runs one training job to its end and returns its result (raises when the job fails)."""

log = logging.getLogger(__name__)


def trial_run_id(run_id: str, number: int) -> str:
    return f"{run_id}.trial-{number:03d}"


def run_trial(
    config: PipelineConfig,
    study: optuna.Study,
    ref: StudyRef,
    slot: int,
    base: TrainSpec,
    launch: Launch,
    *,
    last_attempt: bool = True,
) -> TrialOutcome:
    """The slot's trial, run or continued to its end (complete, pruned or failed)."""
    import optuna

    assert config.tuning is not None
    existing = trial_of_slot(study, slot)
    if existing is not None and existing.state.is_finished():
        log.info(
            "slot %d: trial %d already ended (%s); not trained again",
            slot,
            existing.number,
            existing.state.name,
        )
        return stored_outcome(existing).model_copy(update={"ended_earlier": True})
    if existing is None:
        spent = spent_compute_hours(study)
        budget = config.tuning.budget.max_compute_hours
        if budget is not None and spent >= budget:
            log.warning(
                "slot %d: the study used %.4f of its %.4f device-hours; no trial started", slot, spent, budget
            )
            return TrialOutcome(
                number=-1, slot=slot, state="not_started", params={}, value=None, rungs=[],
                compute_hours=0.0, full_budget_compute_hours=None, mlflow_run_id=None, run_dir=None,
            )  # fmt: skip
        study.sampler = sampler(config.tuning.sampler, slot)
        trial = study.ask()
        trial.set_user_attr("slot", slot)
    else:
        trial = optuna.Trial(study, existing._trial_id)
        log.info("slot %d: continuing trial %d, which an earlier attempt started", slot, trial.number)
    params = suggest(trial, config.tuning)
    log.info("slot %d: trial %d with %s", slot, trial.number, params)
    try:
        hp = trial_hyperparameters(base.hyperparameters, params)
        # A retry's job resumes from the trial's newest checkpoint: rungs it passed are not
        # trained or reported again.
        return _rungs(config, config.tuning, study, trial, ref, slot, base, hp, params, launch)
    except Exception as exc:
        # The last try, or an error no retry can mend (bad data): the study records the failure,
        # so the summary counts it instead of leaving it running forever.
        if last_attempt or (isinstance(exc, TrainpipeError) and not exc.retryable):
            failed = _outcome(trial, slot, params, "failed", None, [], None)
            _end(study, trial, failed, optuna.trial.TrialState.FAIL)
        raise


def _rungs(
    config: PipelineConfig,
    tuning: TuningSection,
    study: optuna.Study,
    trial: optuna.Trial,
    ref: StudyRef,
    slot: int,
    base: TrainSpec,
    hp: Hyperparameters,
    params: dict[str, Any],
    launch: Launch,
) -> TrialOutcome:
    """One training job through every rung: it reports each rung's objective to the study and
    stops itself when the pruner says so; the outcome is told to the study here."""
    from optuna.trial import TrialState

    metric = config.tuning_objective[0]
    rungs = tuning.rungs(tuning.max_resource(base.hyperparameters))
    spec = rung_spec(
        base, ref, trial.number, hp, tuning, rungs[-1], True, rungs=rungs[:-1], trial_id=trial._trial_id
    )
    trial.set_user_attr("run_dir", spec.run_dir)
    result = launch(spec)
    trial.set_user_attr("mlflow_run_id", result.mlflow_run_id)
    trial.set_user_attr("compute_hours", result.compute_hours)
    reports = list(result.rungs)
    value = result.holdout_metrics.get(metric, math.nan)
    if not result.pruned:  # it trained to the full budget (or stopped early on its patience)
        reports.append(RungReport(resource=rungs[-1], value=value))

    def end(state: str, told: Any) -> TrialOutcome:
        outcome = _outcome(trial, slot, params, state, value if state != "failed" else None, reports, result)
        return _end(study, trial, outcome, told, rungs[-1])

    if not math.isfinite(value):  # diverged: an answer of the search, not a broken task
        log.warning("trial %d: %s is %s; the trial failed", trial.number, metric, value)
        return end("failed", TrialState.FAIL)
    if result.pruned:
        log.info("trial %d pruned after %d %s", trial.number, reports[-1].resource, tuning.pruning.resource)
        return end("pruned", TrialState.PRUNED)
    report_once(trial, value, rungs[-1])
    log.info("trial %d: %s %.6f at the full budget", trial.number, metric, value)
    return end("complete", value)


def rung_spec(
    base: TrainSpec,
    ref: StudyRef,
    number: int,
    hp: Hyperparameters,
    tuning: TuningSection,
    resource: int,
    final: bool,
    label: str | None = None,
    rungs: list[int] | None = None,
    trial_id: int | None = None,
) -> TrainSpec:
    """The training job of a trial: its hyperparameters, trained up to `resource`, reporting the
    `rungs` before it to the study (trial `trial_id` of its storage). `label` (default: the trial
    number) names a job of the study that is not a trial, such as `trainpipe tune`'s baseline: its
    run directory `<run_id>.<label>` and its `trainpipe.trial` tag."""
    budget = {"epochs": resource} if tuning.pruning.resource == "epochs" else {"max_steps": resource}
    return base.model_copy(
        update={
            "run_id": trial_run_id(ref.run_id, number) if label is None else f"{ref.run_id}.{label}",
            "hyperparameters": hp.with_overrides(budget),
            "trial": TrialRung(
                number=number,
                validation=_validation(base),
                final=final,
                study_run_id=ref.run_id,
                rungs=rungs or [],
                study_name=ref.study_name if rungs else None,
                trial_id=trial_id if rungs else None,
                budget=tuning.max_resource(hp),
            ),
            "mlflow_run_id": None,  # the trial's run directory remembers its own MLflow run
            "tags": {
                **base.tags,
                "mlflow.parentRunId": ref.parent_run_id,
                STUDY_TAG: ref.study_name,
                TRIAL_TAG: label or str(number),
            },
        }
    )


def _validation(base: TrainSpec) -> ValidationSplit:
    """The rows a trial is scored on: the pipeline's validation split (the config requires one)."""
    split = base.config.data.validation_split()
    assert split is not None  # config/data.py validation_split_problems: tuning needs it
    return split


def _outcome(
    trial: optuna.Trial,
    slot: int,
    params: dict[str, Any],
    state: str,
    value: float | None,
    reports: list[RungReport],
    result: TrainResult | None,
) -> TrialOutcome:
    hours = float(trial.user_attrs.get("compute_hours", 0.0))
    reached = reports[-1].resource if reports else None
    return TrialOutcome.model_validate(
        {
            "number": trial.number,
            "slot": slot,
            "state": state,
            "params": params,
            "value": value,
            "rungs": reports,
            "compute_hours": hours,
            "startup_compute_hours": result.startup_compute_hours if result else 0.0,
            "end_compute_hours": result.end_compute_hours if result else 0.0,
            "study_compute_hours": result.study_compute_hours if result else 0.0,
            "full_budget_compute_hours": None if reached is None else hours,  # scaled by the caller
            "mlflow_run_id": trial.user_attrs.get("mlflow_run_id"),
            "run_dir": trial.user_attrs.get("run_dir"),
            "result": result if state == "complete" else None,
        }
    )


def _end(
    study: optuna.Study,
    trial: optuna.Trial,
    outcome: TrialOutcome,
    told: Any,
    full_resource: int | None = None,
) -> TrialOutcome:
    """Store the outcome on the trial, then finish it in the study (attributes are frozen after)."""
    from optuna.trial import TrialState

    if outcome.rungs and full_resource is not None:
        # Its start-up and its end once, and its own training device-hours per unit of resource
        # times the full budget (a pruned trial's end published nothing: the summary puts the
        # complete trials' end in its place). Without pruning no job asks the study: that time
        # is neither training nor part of the estimate.
        fixed = outcome.startup_compute_hours + outcome.end_compute_hours
        training = max(0.0, outcome.compute_hours - fixed - outcome.study_compute_hours)
        full = fixed + training * full_resource / outcome.rungs[-1].resource
        outcome = outcome.model_copy(update={"full_budget_compute_hours": full})
    trial.set_user_attr("outcome", outcome.to_xcom())
    if isinstance(told, TrialState):
        study.tell(trial, state=told)
    else:
        study.tell(trial, told)
    return outcome


def trial_of_slot(study: optuna.Study, slot: int) -> optuna.trial.FrozenTrial | None:
    found = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("slot") == slot]
    return found[-1] if found else None


def stored_outcome(trial: optuna.trial.FrozenTrial) -> TrialOutcome:
    raw = trial.user_attrs.get("outcome")
    if raw is not None:
        return TrialOutcome.model_validate(raw)
    # Ended without an outcome: told FAIL by something else (a crashed process's heartbeat).
    return TrialOutcome(
        number=trial.number, slot=int(trial.user_attrs.get("slot", -1)), state="failed", params=trial.params,
        value=None, rungs=[], compute_hours=float(trial.user_attrs.get("compute_hours", 0.0)),
        full_budget_compute_hours=None, mlflow_run_id=trial.user_attrs.get("mlflow_run_id"),
        run_dir=trial.user_attrs.get("run_dir"),
    )  # fmt: skip


def spent_compute_hours(study: optuna.Study) -> float:
    return sum(float(t.user_attrs.get("compute_hours", 0.0)) for t in study.get_trials(deepcopy=False))
