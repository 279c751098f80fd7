"""retry_policy: a TrainpipeError's `retryable` decides retry or fail; every operator of ours uses it."""

from __future__ import annotations

import importlib
import inspect
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG, BaseOperator, BaseSensorOperator
from airflow.sdk.definitions.retry_policy import ExceptionRetryPolicy, RetryAction, RetryDecision
from airflow.sdk.exceptions import AirflowException
from airflow.serialization.serialized_objects import DagSerialization

from airflow_trainpipe.config import load_config
from airflow_trainpipe.core.exceptions import ConfigError, ConfigProblem, PayloadError, TrainingJobError
from airflow_trainpipe.core.retry_policy import (
    TRAINPIPE_RETRY_POLICY,
    TrainpipeRetryPolicy,
    TrainpipeRetryPolicyMixin,
)
from airflow_trainpipe.data.snapshots.errors import PartitionError, SnapshotError
from airflow_trainpipe.data.sources.errors import SourceError, SourceUnavailable
from airflow_trainpipe.data.window import WindowError
from airflow_trainpipe.operators.approval import ModelApprovalOperator
from airflow_trainpipe.operators.canary import CanaryPromoteOperator, CanaryStartOperator, CanaryStepOperator
from airflow_trainpipe.operators.config_error import ConfigErrorOperator
from airflow_trainpipe.operators.gate import BaselineGateOperator
from airflow_trainpipe.operators.promote import PromoteModelOperator
from airflow_trainpipe.operators.register import RegisterModelOperator
from airflow_trainpipe.operators.train import DistributedTrainOperator
from airflow_trainpipe.operators.tune import TuningResultOperator, TuningStartOperator, TuningTrialOperator
from airflow_trainpipe.operators.validate import DataValidateOperator
from airflow_trainpipe.registry.reads import RegistryError, RegistryUnavailable
from airflow_trainpipe.sensors.snapshot import DataSnapshotSensor
from tests.conftest import EXAMPLE_CONFIGS

FRAUD_PATH = EXAMPLE_CONFIGS / "fraud_detector.yaml"
FRAUD = str(FRAUD_PATH)


def _decide(exception: BaseException, try_number: int = 1, max_tries: int = 3) -> RetryDecision:
    return TrainpipeRetryPolicy().evaluate(exception, try_number, max_tries, context=None)


@pytest.mark.parametrize(
    "error",
    [
        TrainingJobError("node 1 lost"),
        SnapshotError("no files yet"),
        RegistryUnavailable("server down"),
        SourceUnavailable("connection refused"),
    ],
)
def test_a_retryable_error_is_retried_naming_its_type(error: Exception) -> None:
    name = type(error).__name__
    assert _decide(error) == RetryDecision.retry(reason=f"{name} is retryable: another try can succeed")


@pytest.mark.parametrize(
    "error",
    [
        PayloadError("train is not a TrainResult"),
        PartitionError("'..' is not a sub-path"),
        RegistryError("run 'abc' not found"),
        WindowError("2 of 3 partitions missing"),
        SourceError('relation "clicks" does not exist'),
        ConfigError([ConfigProblem("p.yaml", 3, 7, "gate.metric", "not a metric")]),
    ],
)
def test_an_error_that_is_not_retryable_fails_at_once_naming_its_type(error: Exception) -> None:
    name = type(error).__name__
    assert _decide(error) == RetryDecision.fail(
        reason=f"{name} is not retryable: another try would fail the same way"
    )


def test_the_flag_is_read_from_the_instance_not_the_class() -> None:
    late = PayloadError("the upstream task has not pushed yet")
    late.retryable = True
    assert _decide(late).action is RetryAction.RETRY
    final = TrainingJobError("the job reported bad data")
    final.retryable = False
    assert _decide(final).action is RetryAction.FAIL
    assert (PayloadError.retryable, TrainingJobError.retryable) == (False, True)  # classes untouched


def test_the_decision_does_not_depend_on_the_try() -> None:
    for try_number, max_tries in ((1, 0), (3, 3), (7, 3)):
        assert _decide(PayloadError("x"), try_number, max_tries).action is RetryAction.FAIL
        assert _decide(SnapshotError("x"), try_number, max_tries).action is RetryAction.RETRY


@pytest.mark.parametrize(
    "error",
    [
        KeyError("not ours"),
        OSError("disk full"),
        AirflowException("drift reference 'champion': server down"),
        SystemExit(1),
    ],
)
def test_other_exceptions_get_the_tasks_own_retries(error: BaseException) -> None:
    assert _decide(error) == RetryDecision.default()


def test_an_airflow_exception_caused_by_one_of_ours_gets_the_default() -> None:
    # Code that raises an Airflow exception `from` ours chose Airflow's handling on purpose.
    try:
        raise AirflowException("wrapped") from PayloadError("bad payload")
    except AirflowException as exc:
        assert _decide(exc) == RetryDecision.default()


# -- the operators ----------------------------------------------------------------------------


OPERATORS: list[type[BaseOperator]] = [
    DataSnapshotSensor,
    DataValidateOperator,
    DistributedTrainOperator,
    BaselineGateOperator,
    RegisterModelOperator,
    ModelApprovalOperator,
    PromoteModelOperator,
    ConfigErrorOperator,
    TuningStartOperator,
    TuningTrialOperator,
    TuningResultOperator,
    CanaryStartOperator,
    CanaryStepOperator,
    CanaryPromoteOperator,
]


def _build(cls: type[BaseOperator], **kwargs: Any) -> Any:
    if cls is DataSnapshotSensor:
        return cls(data=load_config(FRAUD).data, **kwargs)
    if cls is ConfigErrorOperator:
        return cls(config_file="configs/x.yaml", problems=["configs/x.yaml: owner: missing"], **kwargs)
    if cls is TuningTrialOperator:
        return cls(config=FRAUD, study={}, slot=0, **kwargs)
    if cls is TuningResultOperator:
        return cls(config=FRAUD, study={}, **kwargs)
    if cls is CanaryStepOperator:
        return cls(config=FRAUD, step=1, **kwargs)
    return cls(config=FRAUD, **kwargs)


def _provider_operator_classes() -> set[type[BaseOperator]]:
    """Every operator and sensor class defined in the modules the provider lists."""
    from airflow_trainpipe.get_provider_info import get_provider_info

    info = get_provider_info()
    modules = [m for kind in ("operators", "sensors") for e in info[kind] for m in e["python-modules"]]
    return {
        value
        for module in map(importlib.import_module, modules)
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, BaseOperator)
        and value.__module__ == module.__name__
        and not value.__name__.startswith("_")  # a module's private base (operators/canary.py's _CanaryTask)
    }


def test_every_operator_and_sensor_of_the_provider_is_covered_here() -> None:
    assert _provider_operator_classes() == set(OPERATORS)


@pytest.mark.parametrize("cls", OPERATORS, ids=lambda cls: cls.__name__)
def test_each_operator_takes_the_package_policy_by_default(cls: type[BaseOperator]) -> None:
    operator = _build(cls, task_id="t")
    assert isinstance(operator, TrainpipeRetryPolicyMixin)
    assert operator.retry_policy is TRAINPIPE_RETRY_POLICY and operator.has_retry_policy


@pytest.mark.parametrize("cls", OPERATORS, ids=lambda cls: cls.__name__)
def test_each_operator_keeps_a_policy_its_caller_chose(cls: type[BaseOperator]) -> None:
    mine = ExceptionRetryPolicy(rules=[])
    assert _build(cls, task_id="t", retry_policy=mine).retry_policy is mine
    assert _build(cls, task_id="t", default_args={"retry_policy": mine}).retry_policy is mine
    assert _build(cls, task_id="t", retry_policy=None).retry_policy is None  # opting out


@pytest.mark.parametrize("cls", OPERATORS, ids=lambda cls: cls.__name__)
def test_the_dags_default_args_choose_before_the_package_default(cls: type[BaseOperator]) -> None:
    mine = ExceptionRetryPolicy(rules=[])
    with DAG("d", schedule=None, start_date=datetime(2026, 1, 1), default_args={"retry_policy": mine}):
        assert _build(cls, task_id="t").retry_policy is mine
    with DAG("e", schedule=None, start_date=datetime(2026, 1, 1), default_args={"retries": 4}):
        assert _build(cls, task_id="t").retry_policy is TRAINPIPE_RETRY_POLICY


def test_a_mapped_task_takes_the_package_policy_too() -> None:
    mine = ExceptionRetryPolicy(rules=[])
    with DAG("mapped", schedule=None, start_date=datetime(2026, 1, 1)):
        default = RegisterModelOperator.partial(task_id="register", config=FRAUD).expand(
            mlflow_run_id=["a", "b"]
        )
        chosen = RegisterModelOperator.partial(task_id="chosen", config=FRAUD, retry_policy=mine).expand(
            mlflow_run_id=["a", "b"]
        )
    assert default.retry_policy is TRAINPIPE_RETRY_POLICY and chosen.retry_policy is mine


def test_the_sensors_own_settings_still_reach_airflows_sensor() -> None:
    data = load_config(FRAUD).data
    data = data.model_copy(update={"wait": data.wait.model_copy(update={"mode": "reschedule"})})
    sensor = DataSnapshotSensor(task_id="wait", data=data)
    assert isinstance(sensor, BaseSensorOperator) and sensor.retry_policy is TRAINPIPE_RETRY_POLICY
    assert (sensor.mode, sensor.deferrable) == ("reschedule", False)


def test_a_dag_using_the_policy_serializes_with_only_a_flag() -> None:
    with DAG(
        "serialized",
        schedule=None,
        start_date=datetime(2026, 1, 1),
        default_args={"retry_policy": TrainpipeRetryPolicy()},
    ) as dag:
        _build(DataValidateOperator, task_id="validate_data")
        _build(DistributedTrainOperator, task_id="train", retry_policy=TrainpipeRetryPolicy())
    data = DagSerialization.to_dict(dag)
    assert "TrainpipeRetryPolicy" not in json.dumps(data)  # no object, no memory address
    stored = DagSerialization.from_dict(data)
    assert {t.task_id: t.has_retry_policy for t in stored.tasks} == {"validate_data": True, "train": True}


# -- through Airflow's task runner --------------------------------------------------------------

RUNNER_DAG = """
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_trainpipe.config import load_config
from airflow_trainpipe.operators.validate import DataValidateOperator
from airflow_trainpipe.registry.reads import RegistryError, RegistryUnavailable
from airflow_trainpipe.sensors.snapshot import DataSnapshotSensor

retried_at_once = {{"retries": 2, "retry_delay": timedelta(0)}}
with DAG("retry_policy", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args=retried_at_once) as dag:
    data = load_config({config!r}).data
    DataSnapshotSensor(task_id="bad_partition", data=data, partition="../elsewhere")
    DataSnapshotSensor(task_id="bad_partition_no_policy", data=data, partition="../elsewhere", retry_policy=None)
    DataValidateOperator(task_id="partition_not_written", config={config!r}, partition="ds=2026-01-01")
"""


@pytest.mark.slow
def test_airflow_fails_a_final_error_after_one_try_and_retries_a_retryable_one(
    airflow_env: dict[str, str], tmp_path: Path
) -> None:
    from tests.helpers.airflow_dags import run_dag_file

    text = FRAUD_PATH.read_text().replace("uri: data/card_transactions", f"uri: {tmp_path.as_uri()}")
    (tmp_path / "fraud.yaml").write_text(text)
    run = run_dag_file(airflow_env, "retry_policy", RUNNER_DAG.format(config=str(tmp_path / "fraud.yaml")))
    assert run.tasks == dict.fromkeys(
        ("bad_partition", "bad_partition_no_policy", "partition_not_written"), "failed"
    ), run.output[-5000:]
    # retries=2 everywhere: the policy spends none on a bad value; without it Airflow spends both.
    assert run.tries == {"bad_partition": 1, "bad_partition_no_policy": 3, "partition_not_written": 3}
    assert "PartitionError is not retryable: another try would fail the same way" in run.output
    assert "SnapshotError is retryable: another try can succeed" in run.output
