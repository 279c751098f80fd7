"""The package's retry policy: a TrainpipeError's own `retryable` flag decides whether Airflow retries.

A task's `retries` cannot tell bad data from a store that is down for a minute; the error can.
Every TrainpipeError says whether another try can succeed (`retryable`, set per class, and per
instance where only the raiser knows). Airflow 3.3 hands the exception a task raised to the
task's `retry_policy`, in the worker, before it decides between retry and fail. So the operators
raise our errors as they are: their type reaches the log and the failure callbacks, and an error
is classified wherever in the task it was raised, not only inside a block that translates it.

Exceptions that are not ours get Airflow's default: a bug or an unforeseen outage is retried as
the task's `retries` say, as in any other Airflow task. One more is final: a human-in-the-loop
request nobody answered in time (`register.on_approval_timeout: fail`), since a retry would ask
again past the deadline the config set.

There is no `serialize()`: a serialized DAG stores only `has_retry_policy`, and the worker
evaluates the policy of the task it parsed from the DAG file.

It imports nothing but `airflow.sdk` and our light `exceptions`: operators import it at DAG parse time.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.definitions.retry_policy import RetryDecision, RetryPolicy

from airflow_trainpipe.core.exceptions import TrainpipeError

if TYPE_CHECKING:
    from airflow.sdk import Context


class TrainpipeRetryPolicy(RetryPolicy):
    """Fail at once on a TrainpipeError that is not `retryable`, retry one that is.

    A retry still counts against the task's `retries`; any other exception is left to them.
    """

    def evaluate(
        self,
        exception: BaseException,
        try_number: int,
        max_tries: int,
        context: Context | None = None,
    ) -> RetryDecision:
        if _unanswered(exception):
            return RetryDecision.fail(
                reason="nobody answered the request within its timeout: a retry would ask again past it"
            )
        if not isinstance(exception, TrainpipeError):
            return RetryDecision.default()
        name = type(exception).__name__
        # Read from the instance: a raiser may override its class's flag.
        if exception.retryable:
            return RetryDecision.retry(reason=f"{name} is retryable: another try can succeed")
        return RetryDecision.fail(reason=f"{name} is not retryable: another try would fail the same way")


def _unanswered(exception: BaseException) -> bool:
    """A HITL request's timeout (the standard provider's HITLTimeoutError), without importing the
    provider where no task of the DAG asks anyone: only a HITL task raises it."""
    module = sys.modules.get("airflow.providers.standard.exceptions")
    timeout = getattr(module, "HITLTimeoutError", None)
    return timeout is not None and isinstance(exception, timeout)


# Stateless, so one instance serves every task.
TRAINPIPE_RETRY_POLICY = TrainpipeRetryPolicy()


class TrainpipeRetryPolicyMixin(BaseOperator):
    """Gives an operator the package's retry policy unless its caller chose one.

    List it before the Airflow base class: `class MyOperator(TrainpipeRetryPolicyMixin, BaseOperator)`.
    A `retry_policy` passed to the operator or found in `default_args` replaces it (`None` too:
    no policy); to add rules of your own, pass a chain that keeps this one first.
    """

    # A parameter default rather than a value set after `super().__init__()`: Airflow fills
    # parameters from `default_args` before the default applies, and `.partial()` reads operator
    # defaults from `__init__` signatures, so mapped tasks get the policy the same way.
    def __init__(self, *, retry_policy: RetryPolicy | None = TRAINPIPE_RETRY_POLICY, **kwargs: Any) -> None:
        super().__init__(retry_policy=retry_policy, **kwargs)
