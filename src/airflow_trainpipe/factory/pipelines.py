"""Config -> DAG: wait_for_data -> validate_data -> train -> gate -> register (-> approve -> promote)."""

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
from airflow.sdk.definitions.callback import AsyncCallback
from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

from airflow_trainpipe.config import PipelineConfig
from airflow_trainpipe.config.loader import duplicate_pipeline
from airflow_trainpipe.config.pools import training_claim, trial_claim
from airflow_trainpipe.config.schedule import aware_datetime
from airflow_trainpipe.config.types import short_duration
from airflow_trainpipe.core.exceptions import ConfigError
from airflow_trainpipe.factory import params
from airflow_trainpipe.factory.broken import broken_config_dag, stand_in_dag_id
from airflow_trainpipe.factory.configs import read_config_folder
from airflow_trainpipe.factory.docs import pipeline_doc
from airflow_trainpipe.notifications.deadline import CALLBACK_PATH
from airflow_trainpipe.notifications.email import PipelineEmailNotifier
from airflow_trainpipe.operators.gate import BaselineGateOperator
from airflow_trainpipe.operators.register import RegisterModelOperator
from airflow_trainpipe.operators.train import DistributedTrainOperator
from airflow_trainpipe.operators.validate import DataValidateOperator
from airflow_trainpipe.registry.versions import waiting_alias
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
    task_defaults = _task_defaults(config)
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
        deadline=_deadline(config),
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
    tuned = _tuning_tasks(config, dag, validate, partition, task_defaults) if config.tuning else None
    train = DistributedTrainOperator(
        task_id="train",
        config=config,
        partition=partition,
        validation=validate.output,  # the ValidationSummary: train reads exactly its manifest's bytes
        hyperparameter_overrides=params.hyperparameter_template(),
        **_after_tuning(tuned),
        **training_claim(config).task_arguments(),
        **task_defaults,
    )
    if tuned is not None:
        tuned >> train
    gate = BaselineGateOperator(
        task_id="gate",
        config=config,
        train_task_id=train.task_id,
        force=params.force_template(),
        **task_defaults,
    )
    wait >> validate >> train >> gate
    _registration_tasks(config, dag, gate, asset, task_defaults)
    return dag


def _registration_tasks(
    config: PipelineConfig, dag: DAG, gate: Any, asset: Asset, task_defaults: dict[str, Any]
) -> None:
    """register; with approval -> approve (-> promote); with a canary -> the canary task group."""
    approval = config.registration.approval == "required"
    stages = waiting_alias(config) is not None  # register only stages; a later task promotes
    register = RegisterModelOperator(
        task_id="register",
        config=config,
        gate_task_id=gate.task_id,
        outlets=[] if stages else [asset],
        **_with_promotion_notice(task_defaults, config, not stages),
    )
    gate >> register
    approved = _approval_tasks(config, register, asset, task_defaults) if approval else register
    if config.canary is not None:
        _canary_tasks(config, dag, approved, asset, task_defaults)


def _after_tuning(tuned: Any) -> dict[str, Any]:
    """After the study, train adopts its best trial (or retrains with it); alone when it was off."""
    if tuned is None:
        return {}
    return {
        "tuned": f"{{{{ ti.xcom_pull(task_ids='{tuned.task_id}') | tojson }}}}",
        "trigger_rule": "none_failed",
    }


def _tuning_tasks(
    config: PipelineConfig, dag: DAG, validate: Any, partition: str, task_defaults: dict[str, Any]
) -> Any:
    """tune_start -> trial (one mapped task instance per trial) -> tune; returns `tune`."""
    # Imported only for pipelines that tune: most DAG folders never need them at parse time.
    from airflow_trainpipe.operators.tune import (
        TuningResultOperator,
        TuningStartOperator,
        TuningTrialOperator,
    )

    trial = trial_claim(config)
    assert config.tuning is not None and trial is not None
    start = TuningStartOperator(
        task_id="tune_start", config=config, enabled=params.tune_template(), dag=dag, **task_defaults
    )
    validate >> start
    trials = TuningTrialOperator.partial(
        task_id="trial",
        config=config,
        partition=partition,
        validation=validate.output,
        hyperparameter_overrides=params.hyperparameter_template(),
        study=start.output,
        max_active_tis_per_dagrun=config.tuning.budget.max_parallel,
        **trial.task_arguments(),
        dag=dag,
        **task_defaults,
    ).expand(slot=list(range(config.tuning.budget.trials)))
    result = TuningResultOperator(task_id="tune", config=config, study=start.output, dag=dag, **task_defaults)
    trials >> result
    return result


def _task_defaults(config: PipelineConfig) -> dict[str, Any]:
    """What every task gets: the owner, the schedule's retries, the `failure` e-mail."""
    s = config.schedule
    defaults: dict[str, Any] = {
        "owner": config.owner,
        "retries": s.retries,
        "retry_delay": s.retry_delay,
        "retry_exponential_backoff": s.retry_exponential_backoff,
    }
    failure = PipelineEmailNotifier.for_event(config.notify, config.pipeline, "failure")
    if failure is not None:
        defaults["on_failure_callback"] = [failure]
    return defaults


def _approval_tasks(
    config: PipelineConfig, register: Any, asset: Asset, task_defaults: dict[str, Any]
) -> Any:
    """register -> approve (Required Actions) -> promote; a rejection skips promote. With a canary,
    approve's yes starts the canary instead, whose last task promotes; returns approve."""
    # Imported only for pipelines that ask for approval: the HITL operator is the standard
    # provider's, and most DAG folders never need it at parse time.
    from airflow_trainpipe.operators.approval import ModelApprovalOperator
    from airflow_trainpipe.operators.promote import PromoteModelOperator

    asked = PipelineEmailNotifier.for_event(config.notify, config.pipeline, "approval_needed")
    approve = ModelApprovalOperator(
        task_id="approve",
        config=config,
        register_task_id=register.task_id,
        notifiers=[asked] if asked is not None else None,
        # Retried as every task: a worker lost before the request is written, or MLflow down past
        # its client's retries while the answer is recorded, would otherwise fail the run. A retry
        # asks again (the request belongs to the try); a request nobody answered in time is final
        # (core/retry_policy.py).
        **task_defaults,
    )
    register >> approve
    if config.canary is not None:
        return approve
    promote = PromoteModelOperator(
        task_id="promote",
        config=config,
        register_task_id=register.task_id,
        approval_task_id=approve.task_id,
        outlets=[asset],
        **_with_promotion_notice(task_defaults, config, True),
    )
    approve >> promote
    return approve


def _canary_tasks(
    config: PipelineConfig, dag: DAG, upstream: Any, asset: Asset, task_defaults: dict[str, Any]
) -> None:
    """canary.start -> canary.step_1 ... step_n (each waits in the triggerer) -> canary.promote."""
    from airflow.sdk import TaskGroup, chain

    from airflow_trainpipe.operators.canary import (
        CanaryPromoteOperator,
        CanaryStartOperator,
        CanaryStepOperator,
    )

    assert config.canary is not None
    with TaskGroup("canary", dag=dag, tooltip="the gate's winner beside the champion, step by step"):
        start = CanaryStartOperator(task_id="start", config=config, dag=dag, **task_defaults)
        # A failed step is final: the evidence would not change on a retry.
        steps = [
            CanaryStepOperator(
                task_id=f"step_{n}", step=n, config=config, dag=dag, **{**task_defaults, "retries": 0}
            )
            for n in range(1, len(config.canary.steps) + 1)
        ]
        promote = CanaryPromoteOperator(
            task_id="promote",
            config=config,
            dag=dag,
            outlets=[asset],
            trigger_rule="none_failed",  # also after a skipped start: no champion yet to canary against
            **_with_promotion_notice(task_defaults, config, True),
        )
    chain(upstream, start, *steps, promote)


def _with_promotion_notice(
    task_defaults: dict[str, Any], config: PipelineConfig, promotes: bool
) -> dict[str, Any]:
    """The task's arguments, with the `promotion` e-mail on success when this task moves the champion."""
    notice = (
        PipelineEmailNotifier.for_event(config.notify, config.pipeline, "promotion") if promotes else None
    )
    return {**task_defaults, "on_success_callback": [notice]} if notice is not None else task_defaults


def _deadline(config: PipelineConfig) -> DeadlineAlert | None:
    s, notify = config.schedule, config.notify
    if s.deadline is None or notify is None:  # the config requires notify with a deadline
        return None
    # A run of a partitioned asset has no logical date: its clock starts when it is queued.
    reference = (
        DeadlineReference.DAGRUN_QUEUED_AT if s.asset is not None else DeadlineReference.DAGRUN_LOGICAL_DATE
    )
    return DeadlineAlert(
        reference=reference,
        interval=s.deadline,
        callback=AsyncCallback(
            CALLBACK_PATH,
            kwargs={
                "pipeline": config.pipeline,
                "email": list(notify.email),
                "smtp_conn_id": notify.smtp_conn_id,
                "from_email": notify.from_email,
                "deadline": short_duration(s.deadline),
            },
        ),
        name=f"{config.pipeline} deadline",
    )


def _schedule(config: PipelineConfig) -> Any:
    s = config.schedule
    if s.asset is not None:
        # By reference: the producing DAG's asset may carry a URI the config does not repeat.
        upstream = Asset.ref(uri=s.asset) if "://" in s.asset else Asset.ref(name=s.asset)
        if s.asset_partitions is None:
            return upstream
        # A rolling data.window is laid out by the task (data/window.py), not by a RollupMapper:
        # Airflow's windows are fixed calendar periods, and "the last 30 days" slides every run.
        return PartitionedAssetTimetable(
            assets=upstream, default_partition_mapper=_PARTITION_MAPPERS[s.asset_partitions]()
        )
    if s.cron is None:  # unreachable: the schedule section requires exactly one of asset and cron
        raise ValueError(f"pipeline {config.pipeline}: schedule has neither asset nor cron")
    if s.cron in _NOT_CRON:
        return s.cron
    return CronTriggerTimetable(s.cron, timezone=s.timezone)
