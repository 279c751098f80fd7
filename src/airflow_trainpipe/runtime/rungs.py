"""A tuning trial's rungs inside its one training job.

A trial is one job trained towards its full budget. At each rung's end (an epoch count, or a step
count) rank 0 reports the objective to the study's storage and asks the study's pruner, Optuna's
own `Trial.report` / `Trial.should_prune` against what the other trials reported at that rung;
every rank gets the answer and the job stops, cleanly, when it is "prune". The rung values are
kept in the checkpoint's state: a killed attempt's retry resumes from its newest checkpoint and
reports what the study is missing before it goes on, so no rung is trained or decided twice.

The pruner is rebuilt from the config here because Optuna keeps none in the storage.
"""

from __future__ import annotations

import logging
import math
import os
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.config import PipelineConfig
from airflow_trainpipe.contracts.train_spec import TrialRung
from airflow_trainpipe.core.exceptions import TrainpipeError

if TYPE_CHECKING:
    import optuna

STORAGE_ENV = "TRAINPIPE_OPTUNA_STORAGE"
"""The study storage's SQLAlchemy URL, handed to the job in its environment (never in the spec)."""

log = logging.getLogger(__name__)


class StudyUnreachable(TrainpipeError):
    """The job cannot report to its study (no storage URL, or the database is down)."""

    retryable = True


def pruner(config: PipelineConfig) -> optuna.pruners.BasePruner:
    """The study's pruner, as the config names it (Optuna stores none)."""
    import optuna

    assert config.tuning is not None
    pruning = config.tuning.pruning
    if pruning.kind == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=pruning.min_resource, reduction_factor=pruning.reduction_factor
        )
    if pruning.kind == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=pruning.min_resource,
            max_resource=config.tuning_max_resource,
            reduction_factor=pruning.reduction_factor,
        )
    return optuna.pruners.NopPruner()


def rdb_storage(url: str) -> optuna.storages.RDBStorage:
    import optuna

    # Parallel trials write to one SQLite file: wait for its lock instead of failing at once.
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)


class TrialRungs:
    """The rung ends of one trial's job and the study's decision at each (rank 0 talks to the study)."""

    def __init__(self, trial: TrialRung, config: PipelineConfig):
        assert config.tuning is not None
        self.ends = list(trial.rungs)
        self.by_steps = config.tuning.pruning.resource == "steps"
        self.metric = config.tuning_objective[0]
        self.spec, self.config = trial, config
        self._trial: optuna.Trial | None = None

    def ending(self, epochs_done: int, step: int, epoch_end: bool) -> int | None:
        """The rung that ends here, if one does: an epoch count at an epoch's end, or a step."""
        if self.by_steps:
            return step if step in self.ends else None
        return epochs_done if epoch_end and epochs_done in self.ends else None

    def decide(self, values: dict[int, float], at: int) -> bool:
        """Rank 0: report every rung value the study lacks, then whether the trial stops at `at`.
        A value that is not finite (diverged) stops it without asking: the task records a failure."""
        value = values[at]
        if not math.isfinite(value):
            log.warning("trial %d: %s is %s at %d; stopping", self.spec.number, self.metric, value, at)
            return True
        trial = self._study_trial()
        for end in sorted(values):
            if math.isfinite(values[end]):
                report_once(trial, values[end], end)
        prune = bool(trial.should_prune())
        log.info(
            "trial %d: %s %.6f after %d %s: %s",
            self.spec.number, self.metric, value, at, "steps" if self.by_steps else "epochs",
            "pruned" if prune else "goes on",
        )  # fmt: skip
        return prune

    def _study_trial(self) -> optuna.Trial:
        import optuna

        if self._trial is None:
            url = os.environ.get(STORAGE_ENV)
            if not url:
                raise StudyUnreachable(
                    f"trial {self.spec.number} has rungs but {STORAGE_ENV} is not set: the job cannot "
                    f"ask study {self.spec.study_name!r} whether to go on"
                )
            try:
                study = optuna.load_study(
                    study_name=self.spec.study_name, storage=rdb_storage(url), pruner=pruner(self.config)
                )
            except Exception as exc:  # a database that is down or busy can come back: a retry resumes
                raise StudyUnreachable(
                    f"cannot open study {self.spec.study_name!r}: {type(exc).__name__}: {exc}"
                ) from exc
            assert self.spec.trial_id is not None
            self._trial = optuna.Trial(study, self.spec.trial_id)
        return self._trial


def report_once(trial: optuna.Trial, value: float, resource: int) -> None:
    """Report `value` at `resource` unless the study already holds one there (an earlier attempt
    reported it; Optuna would warn and keep the first)."""
    if resource not in trial.study._storage.get_trial(trial._trial_id).intermediate_values:
        trial.report(value, resource)


def rung_values(state: dict[str, Any]) -> dict[int, float]:
    """The rung values a checkpoint's state holds (JSON keys are strings)."""
    return {int(k): float(v) for k, v in state.get("rungs", {}).items()}
