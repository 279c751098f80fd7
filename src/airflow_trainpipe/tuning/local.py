"""`trainpipe tune`: the DAG's study without a scheduler, up to `max_parallel` trials at once here.

The same study (same storage and name for the same pipeline and run id), the same trial code and
the same training entrypoint as the mapped trial tasks; a rerun after a kill resumes the study:
finished trials are read back, the interrupted one continues from its checkpoint.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_trainpipe.config import PipelineConfig
from airflow_trainpipe.contracts.payloads import TrainResult
from airflow_trainpipe.contracts.tags import LAUNCHED_BY_TAG
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.tuning.outcomes import StudyRef, TuningSummary
from airflow_trainpipe.tuning.trials import run_trial, rung_spec

if TYPE_CHECKING:
    import optuna
    from mlflow import MlflowClient

log = logging.getLogger(__name__)

Printer = Callable[[str], None]


@dataclass(frozen=True)
class LocalTuning:
    summary: TuningSummary
    baseline: float | None
    """The config's own hyperparameters at the full budget, scored on the same validation split."""


def launch_locally(
    nproc: int,
    printer: Printer,
    verbose: bool = False,
    env: dict[str, str] | None = None,
    jobs_on_host: int = 1,
) -> Callable[[TrainSpec], TrainResult]:
    """A job run here to its result (launchers/runner.py; TrainingJobError if it fails), up to
    `jobs_on_host` at once, sharing the cores. A CPU job is forked from the warm parent (its
    imports paid once per study, not per trial: launchers/forked.py); a GPU job runs under the
    torchrun command."""
    from airflow_trainpipe.launchers.runner import Placement, run_training

    placement = Placement(nproc=nproc, env=env or {}, jobs_on_host=jobs_on_host, fork=True, show_raw=False)
    return functools.partial(run_training, placement=placement, on_line=printer if verbose else None)


def tune_locally(
    config: PipelineConfig,
    base: TrainSpec,
    url: str,
    nproc: int,
    printer: Printer = lambda text: print(text, file=sys.stderr, flush=True),
    verbose: bool = False,
    max_parallel: int | None = None,
) -> LocalTuning:
    """The study's trials, up to `max_parallel` (default: `budget.max_parallel`) at once, each its
    own job of `nproc` processes; a trial that fails is recorded failed and the others go on."""
    from mlflow import MlflowClient

    from airflow_trainpipe.core.tracking_store import default_tracking_uri
    from airflow_trainpipe.runtime.rungs import STORAGE_ENV
    from airflow_trainpipe.tuning.report import log_study, start_parent_run, summarize
    from airflow_trainpipe.tuning.study import open_study, study_name

    assert config.tuning is not None
    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    client = MlflowClient(tracking_uri=tracking_uri)
    name = study_name(config.pipeline, base.run_id)
    study = open_study(config, name, url)
    parent = start_parent_run(client, config.pipeline, name, {LAUNCHED_BY_TAG: "cli"}, tracking_uri)
    ref = StudyRef(study_name=name, storage=url, parent_run_id=parent, run_id=base.run_id)
    parallel = max(1, max_parallel or config.tuning.budget.max_parallel)
    launch = launch_locally(nproc, printer, verbose, env={STORAGE_ENV: url}, jobs_on_host=parallel)
    warm_parent_s = _start_warm_parent(config, nproc, printer)
    from concurrent.futures import ThreadPoolExecutor

    def one(slot: int) -> None:
        # A study object per trial: a trial sets the study's sampler for its own draw.
        _trial(config, open_study(config, name, url), ref, slot, base, launch, client, printer)

    try:
        with ThreadPoolExecutor(parallel, thread_name_prefix="trial") as pool:
            list(pool.map(one, range(config.tuning.budget.trials)))
        summary = summarize(study, ref, warm_parent_s=warm_parent_s)
        # The baseline runs alone: it gets the whole host.
        baseline = _baseline(
            config, base, ref, launch_locally(nproc, printer, verbose, env={STORAGE_ENV: url})
        )
    finally:
        if warm_parent_s:  # a caller that goes on (not the CLI) keeps no idle parent of torch
            from airflow_trainpipe.launchers.forked import stop_warm_parent

            stop_warm_parent()
    log_study(client, study, summary)
    return LocalTuning(summary, baseline.holdout_metrics.get(summary.metric))


def _start_warm_parent(config: PipelineConfig, nproc: int, printer: Printer) -> float:
    """Before the trial threads: forking the warm parent is safe only while it has started no
    thread, and it is started with this process's environment. Its seconds are the study's."""
    from airflow_trainpipe.launchers.forked import forkable, warm_parent
    from airflow_trainpipe.launchers.local import job_environment

    gpus = config.training.resources.gpus_per_node
    if not forkable(gpus):
        return 0.0
    seconds = warm_parent(job_environment(gpus, nproc))
    printer(f"warm parent: torch, DeepSpeed, MLflow and Optuna imported once, in {seconds:.1f} s")
    return seconds


def _trial(
    config: PipelineConfig,
    study: optuna.Study,
    ref: StudyRef,
    slot: int,
    base: TrainSpec,
    launch: Callable[[TrainSpec], TrainResult],
    client: MlflowClient,
    printer: Printer,
) -> None:
    """One slot's trial to its end; its failure is the study's record, not the command's end."""
    from airflow_trainpipe.tuning.report import tag_trial_run

    try:
        outcome = run_trial(config, study, ref, slot, base, launch)
    except Exception as exc:  # recorded FAIL in the study by run_trial (the CLI's only attempt)
        printer(f"trial of slot {slot}: failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        return
    tag_trial_run(client, outcome)
    rungs = ", ".join(f"{r.value:.4f}@{r.resource}" for r in outcome.rungs)
    earlier = " (ended in an earlier run of this study: not trained again)" if outcome.ended_earlier else ""
    printer(f"trial {outcome.number} (slot {slot}): {outcome.state} [{rungs}] {outcome.params}{earlier}")


def _baseline(
    config: PipelineConfig, base: TrainSpec, ref: StudyRef, launch: Callable[[TrainSpec], TrainResult]
) -> TrainResult:
    """The config's hyperparameters trained to the full budget on the trials' split (resumed
    like a trial when a rerun finds its checkpoint)."""
    assert config.tuning is not None
    resource = config.tuning.max_resource(base.hyperparameters)
    spec = rung_spec(
        base, ref, 0, base.hyperparameters, config.tuning, resource, final=False, label="baseline"
    )
    log.info("baseline: the config's hyperparameters for %d %s", resource, config.tuning.pruning.resource)
    return launch(spec)
