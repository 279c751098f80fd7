"""retry_policy: a TrainpipeError's `retryable` decides retry or fail."""

from __future__ import annotations

import pytest
from airflow.sdk.definitions.retry_policy import RetryAction, RetryDecision
from airflow.sdk.exceptions import AirflowException

from airflow_trainpipe.exceptions import ConfigError, ConfigProblem, PayloadError, TrainingJobError
from airflow_trainpipe.registry import RegistryError, RegistryUnavailable
from airflow_trainpipe.retry_policy import TrainpipeRetryPolicy
from airflow_trainpipe.snapshot import PartitionError, SnapshotError
from airflow_trainpipe.window import WindowError


def _decide(exception: BaseException, try_number: int = 1, max_tries: int = 3) -> RetryDecision:
    return TrainpipeRetryPolicy().evaluate(exception, try_number, max_tries, context=None)


@pytest.mark.parametrize(
    "error",
    [TrainingJobError("node 1 lost"), SnapshotError("no files yet"), RegistryUnavailable("server down")],
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
