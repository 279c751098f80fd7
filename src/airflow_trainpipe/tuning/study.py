"""The Optuna study of one pipeline run: storage, sampler, pruner, and the search space.

The study lives in an RDB storage (an SQLite file by default, PostgreSQL in production), keyed by
the pipeline and the run: a retried task, a cleared DAG run or a rerun of `trainpipe tune` finds the
same study, and the trials it finished stay finished.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.config import PipelineConfig
from airflow_trainpipe.config.training import Hyperparameters
from airflow_trainpipe.config.tuning import SamplerSection, TuningSection, hyperparameter_overrides
from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.core.storage import trainpipe_home
from airflow_trainpipe.runtime.rungs import pruner, rdb_storage

__all__ = ["TuningError", "open_study", "pruner", "sampler", "storage_url", "study_name", "suggest"]

if TYPE_CHECKING:
    import optuna

STORAGE_DIR = "optuna"


class TuningError(TrainpipeError):
    """The study cannot go on (its storage, or a trial's hyperparameters)."""

    retryable = False


def study_name(pipeline: str, run_id: str) -> str:
    return f"{pipeline}:{run_id}"


def storage_url(config: PipelineConfig, connection_uri: str | None = None) -> str:
    """The SQLAlchemy URL of the study's storage: the connection's, or an SQLite file under
    TRAINPIPE_HOME/optuna (one per pipeline; studies are keyed by run inside it)."""
    if connection_uri:
        # Airflow writes PostgreSQL connections as postgres://, which SQLAlchemy 2 no longer reads.
        return (
            "postgresql://" + connection_uri.removeprefix("postgres://")
            if connection_uri.startswith("postgres://")
            else connection_uri
        )
    folder = trainpipe_home() / STORAGE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / f'{config.pipeline}.db'}"


def open_study(config: PipelineConfig, name: str, url: str) -> optuna.Study:
    """Create the study, or load it with everything it already holds."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    tuning = _tuning(config)
    # Optuna says "Using an existing study ... instead of creating a new one" at INFO on every
    # open, and every trial opens the study: a line per trial in `trainpipe tune` and each trial
    # task's log. Its warnings still show.
    opening = logging.getLogger("optuna.study.study")
    level = opening.level
    opening.setLevel(max(level, logging.WARNING))
    try:
        storage = rdb_storage(url)
        study = optuna.create_study(
            study_name=name,
            storage=storage,
            sampler=sampler(tuning.sampler),
            pruner=pruner(config),
            direction=config.tuning_objective[1],
            load_if_exists=True,
        )
        if "metric" not in study.user_attrs:
            study.set_user_attr("metric", config.tuning_objective[0])
        return study
    except (SQLAlchemyError, OSError) as exc:
        error = TuningError(f"cannot open the Optuna study {name!r}: {type(exc).__name__}: {exc}")
        error.retryable = True  # a database that is down or busy can come back
        raise error from exc
    finally:
        opening.setLevel(level)


def _tuning(config: PipelineConfig) -> TuningSection:
    if config.tuning is None:
        raise TuningError(f"pipeline {config.pipeline} has no tuning section")
    return config.tuning


def sampler(section: SamplerSection, slot: int = 0) -> optuna.samplers.BaseSampler:
    """The study's sampler as trial `slot` draws with it.

    Each trial task opens the study in its own process: one seed everywhere would make every
    parallel trial draw the same values. A random or TPE draw is seeded by (seed, slot): distinct
    per slot, the same again when a slot runs again. QMC needs no offset: its points are indexed
    by the study's own trial count, and one scramble seed keeps the sequence low-discrepancy.
    """
    import optuna

    if section.kind == "qmc":
        return optuna.samplers.QMCSampler(seed=section.seed, scramble=True)
    seed = section.seed * 1_000_003 + slot
    if section.kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=section.startup_trials)
    return optuna.samplers.RandomSampler(seed=seed)


def suggest(trial: optuna.Trial, space: TuningSection) -> dict[str, Any]:
    """The trial's value of every dimension (the stored ones, for a trial that already drew them)."""
    params: dict[str, Any] = {}
    for name, dimension in space.space.items():
        if dimension.type == "float":
            params[name] = trial.suggest_float(
                name, dimension.low, dimension.high, log=dimension.log, step=dimension.step
            )
        elif dimension.type == "int":
            params[name] = trial.suggest_int(
                name, dimension.low, dimension.high, log=dimension.log, step=dimension.step
            )
        else:
            # Optuna's choices are scalars: a list choice (layer sizes) travels as its JSON text.
            encoded = [json.dumps(c) if isinstance(c, list) else c for c in dimension.choices]
            value = trial.suggest_categorical(name, encoded)
            params[name] = (
                json.loads(value) if isinstance(value, str) and value not in dimension.choices else value
            )
    return params


def trial_hyperparameters(hp: Hyperparameters, params: dict[str, Any]) -> Hyperparameters:
    """The config's hyperparameters with a trial's values, validated like the YAML."""
    from pydantic import ValidationError

    try:
        return hp.with_overrides(hyperparameter_overrides(hp.model_args, params))
    except ValidationError as exc:
        raise TuningError(f"the trial's hyperparameters {params} are invalid: {exc}") from exc


def as_overrides(hp: Hyperparameters, params: dict[str, Any]) -> dict[str, Any]:
    """A trial's values as `hyperparameter_overrides` of the train task (a final retrain)."""
    tuned = trial_hyperparameters(hp, params)
    return {k: v for k, v in tuned.model_dump(mode="json").items() if getattr(hp, k) != getattr(tuned, k)}
