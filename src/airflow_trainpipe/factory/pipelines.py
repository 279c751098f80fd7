"""Config -> DAG: wait_for_data -> validate_data -> train -> gate -> register."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow.sdk import (
    DAG,
    Asset,
    CronTriggerTimetable,
    IdentityMapper,
    PartitionedAssetTimetable,
    PartitionMapper,
    StartOfDayMapper,
    StartOfHourMapper,
)

from airflow_trainpipe.config import PipelineConfig
from airflow_trainpipe.config.loader import duplicate_pipeline
from airflow_trainpipe.config.schedule import aware_datetime
from airflow_trainpipe.exceptions import ConfigError
from airflow_trainpipe.factory import params
from airflow_trainpipe.factory.broken import broken_config_dag, stand_in_dag_id
from airflow_trainpipe.factory.configs import read_config_folder
from airflow_trainpipe.factory.docs import pipeline_doc
from airflow_trainpipe.operators.gate import BaselineGateOperator
from airflow_trainpipe.operators.register import RegisterModelOperator
from airflow_trainpipe.operators.train import DistributedTrainOperator
from airflow_trainpipe.operators.validate import DataValidateOperator
from airflow_trainpipe.sensors.snapshot import DataSnapshotSensor

log = logging.getLogger(__name__)

_PARTITION_MAPPERS: dict[str, type[PartitionMapper]] = {
    "key": IdentityMapper,
    "hour": StartOfHourMapper,
    "day": StartOfDayMapper,
}

# Timetable presets that are not cron expressions.
_NOT_CRON = ("@once", "@continuous")


def register_pipelines(
    folder: str | Path, namespace: dict[str, Any], display_root: str | Path | None = None
) -> list[DAG]:
    """Build every config of `folder` into a DAG and bind it in `namespace` (a DAG file's globals())."""
    folder = Path(folder)
    dags = build_pipeline_dags(folder, Path(display_root) if display_root else folder.parent)
    for dag in dags:
        namespace[dag.dag_id] = dag
    return dags


def build_pipeline_dags(folder: Path, display_root: Path | None = None) -> list[DAG]:
    """One DAG per config; a config that does not parse becomes its stand-in error DAG."""
    with _collector_paused():
        return _build(folder, display_root)


@contextmanager
def _collector_paused() -> Iterator[None]:
    # Building hundreds of DAGs allocates a burst of objects that all stay alive; the cyclic
    # collector would walk the whole DAG-processor heap (Airflow, SQLAlchemy) several times
    # over for nothing to free. Re-enabled as found; nothing is collected on the way out.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _build(folder: Path, display_root: Path | None) -> list[DAG]:
    owners: dict[str, str] = {}
    failed: list[tuple[str, ConfigError]] = []
    dags: list[DAG] = []
    for file in read_config_folder(folder, display_root):
        config, error = file.config, file.error
        if config is not None and config.pipeline in owners:
            error = _duplicate(file.name, config.pipeline, owners[config.pipeline])
            config = None
        if config is not None:
            try:
                dags.append(pipeline_dag(config, file.name))
            except Exception as exc:  # a config Airflow refuses, or a bug of ours: this pipeline only
                log.error("building the DAG of pipeline config %s failed", file.name, exc_info=exc)
                error = ConfigError.unexpected(file.name, "building its DAG", exc, pipeline=config.pipeline)
            else:
                owners[config.pipeline] = file.name
        if error is not None:
            failed.append((file.name, error))
    # Stand-ins second: a valid pipeline keeps its id even if a broken file claims the same name.
    for name, error in failed:
        log.error("pipeline config %s is invalid; its DAG shows the error:\n%s", name, error)
        dag_id = stand_in_dag_id(name, error.pipeline, owners)
        try:
            dags.append(broken_config_dag(name, error, dag_id))
        except Exception:  # nothing left to show it with: the log has it, the other DAGs load
            log.exception("the stand-in DAG %s of %s could not be built", dag_id, name)
        else:
            owners[dag_id] = name
    return dags


def _duplicate(name: str, pipeline: str, first: str) -> ConfigError:
    return ConfigError([duplicate_pipeline(name, pipeline, first)])


def model_asset(config: PipelineConfig) -> Asset:
    """Updated each time `register` promotes a version: downstream DAGs can schedule on a new champion."""
    name, alias = config.registered_model_name, config.registration.alias
    return Asset(
        name=f"{name}@{alias}",
        uri=f"x-mlflow-model://{name}/{alias}",
        group="model",
        extra={"model_uri": f"models:/{name}@{alias}", "pipeline": config.pipeline},
    )


def pipeline_dag(config: PipelineConfig, source: str) -> DAG:
    s = config.schedule
    asset = model_asset(config)
    partition = params.partition_template(config)
    task_defaults: dict[str, Any] = {
        "owner": config.owner,
        "retries": s.retries,
        "retry_delay": s.retry_delay,
        "retry_exponential_backoff": s.retry_exponential_backoff,
    }
    dag = DAG(
        dag_id=config.pipeline,
        description=config.description,
        doc_md=pipeline_doc(config, source, asset.name),
        schedule=_schedule(config),
        start_date=aware_datetime(s.start_date, s.timezone),
        end_date=aware_datetime(s.end_date, s.timezone) if s.end_date else None,
        catchup=s.catchup,
        max_active_runs=s.max_active_runs,
        dagrun_timeout=s.dagrun_timeout,
        tags=["trainpipe", *config.tags],
        params=params.trigger_params(config),
        default_args=task_defaults,
    )
    # Built outside `with dag:` and added after: inside the context every operator deep-copies
    # the DAG's Params (once per class in its hierarchy), the largest per-DAG parse cost. A task
    # needs no copy: the task runner merges the DAG's Params into each run's (`process_params`).
    wait = DataSnapshotSensor(task_id="wait_for_data", data=config.data, partition=partition, **task_defaults)
    validate = DataValidateOperator(
        task_id="validate_data", config=config, partition=partition, **task_defaults
    )
    # Tasks join the DAG through their relations (train through its XComArgs of validate,
    # gate and register through `>>`), which need one end to be in the DAG already.
    dag.add_tasks([wait, validate])
    train = DistributedTrainOperator(
        task_id="train",
        config=config,
        partition=partition,
        validation=validate.output,  # the ValidationSummary: train reads exactly its manifest's bytes
        hyperparameter_overrides=params.hyperparameter_template(),
        **task_defaults,
    )
    gate = BaselineGateOperator(
        task_id="gate",
        config=config,
        train_task_id=train.task_id,
        force=params.force_template(),
        **task_defaults,
    )
    register = RegisterModelOperator(
        task_id="register", config=config, gate_task_id=gate.task_id, outlets=[asset], **task_defaults
    )
    wait >> validate >> train >> gate >> register
    return dag


def _schedule(config: PipelineConfig) -> Any:
    s = config.schedule
    if s.asset is not None:
        # By reference: the producing DAG's asset may carry a URI the config does not repeat.
        upstream = Asset.ref(uri=s.asset) if "://" in s.asset else Asset.ref(name=s.asset)
        if s.asset_partitions is None:
            return upstream
        # A rolling data.window is laid out by the task (runtime/window.py), not by a RollupMapper:
        # Airflow's windows are fixed calendar periods, and "the last 30 days" slides every run.
        return PartitionedAssetTimetable(
            assets=upstream, default_partition_mapper=_PARTITION_MAPPERS[s.asset_partitions]()
        )
    if s.cron is None:  # unreachable: the schedule section requires exactly one of asset and cron
        raise ValueError(f"pipeline {config.pipeline}: schedule has neither asset nor cron")
    if s.cron in _NOT_CRON:
        return s.cron
    return CronTriggerTimetable(s.cron, timezone=s.timezone)
