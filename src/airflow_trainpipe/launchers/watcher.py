"""JobWatcher: follows one training job's output, whatever launched it.

The local launcher (torchrun's stdout), the Kubernetes path (the leader pod's log, as the pod
operator's `log_formatter`) and `trainpipe train` feed it the job's lines one by one. It keeps
what the task needs: the typed result, the errors and whether a retry can help, the MLflow run
id, the last lines of plain output; and it writes the MLflow run id and the newest checkpoint into Airflow's
`task_state_store` (when given) as it happens, so the next try knows the MLflow run and the
last checkpoint even if this worker dies.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from airflow_trainpipe.contracts.events import parse
from airflow_trainpipe.contracts.payloads import TrainResult, read_payload
from airflow_trainpipe.core.exceptions import TrainingJobError
from airflow_trainpipe.launchers.display import describe


class JobWatcher:
    def __init__(self, store: Any = None, *, show_raw: bool = True, tail: int = 30):
        self.store = store
        self.show_raw = show_raw
        self.result: TrainResult | None = None
        self.errors: list[str] = []
        self.final = False  # the job said a retry cannot help (bad data)
        self.mlflow_run_id: str | None = None
        self.preempted: dict[str, Any] | None = None  # the job saved on SIGTERM and stopped
        self.tail: deque[str] = deque(maxlen=tail)

    def feed(self, text: str) -> str | None:
        """Take one line of output; returns what to show for it (None: nothing)."""
        event = parse(text)
        if event is None:
            self.tail.append(text)
            return text if self.show_raw else None
        kind = event.get("event")
        if kind == "start" and event.get("mlflow_run_id"):
            self.mlflow_run_id = event["mlflow_run_id"]
            self._remember("mlflow_run_id", self.mlflow_run_id)
        elif kind == "checkpoint":
            self._remember("checkpoint", {"step": event["step"], "uri": event["uri"]})
        elif kind == "preempted":
            self.preempted = event
            self._remember("checkpoint", {"step": event["step"], "uri": event["checkpoint"]})
        elif kind == "result":
            self.result = read_payload(
                TrainResult, {k: v for k, v in event.items() if k != "event"}, "the job's result event"
            )
        elif kind == "error":
            self.errors.append(f"rank {event.get('rank')}: {event.get('error')}")
            self.final = self.final or event.get("retryable") is False
        return describe(event)

    def log_formatter(self, container: str, message: str) -> str:
        """The KubernetesPodOperator's `log_formatter`: a line must always come back."""
        return self.feed(message) or message

    def _remember(self, key: str, value: Any) -> None:
        if self.store is not None:
            self.store.set(key, value)

    def failure(
        self, what: str, retry_hint: str, cause: BaseException | None = None, exit_code: int | None = None
    ) -> TrainingJobError:
        """The task's exception for a job that failed. Whether Airflow retries it is the package's
        retry policy's to decide (core/retry_policy.py), from the error's `retryable`: not when a
        rank said a retry cannot help (bad data), else yes."""
        if self.final:
            return TrainingJobError(
                f"{what}, not retried: {self.errors[0]}", retryable=False, exit_code=exit_code
            )
        if self.preempted is not None and not self.errors:
            # Retryable: the ranks checkpointed the step they stopped at, nothing is recomputed.
            return TrainingJobError(
                f"{what}: preempted (SIGTERM) after step {self.preempted['step']}; checkpoint "
                f"{self.preempted['checkpoint']} was complete {self.preempted['signal_to_saved_s']} s "
                "after the signal, and the next try resumes from it",
                exit_code=exit_code,
            )
        reason = f": {self.errors[0]}" if self.errors else f": {cause}" if cause is not None else ""
        return TrainingJobError(
            f"{what}{reason}; {retry_hint}. Last output:\n" + "\n".join(self.tail), exit_code=exit_code
        )
