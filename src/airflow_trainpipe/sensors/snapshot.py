"""DataSnapshotSensor: the `wait_for_data` task."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.core.retry_policy import TrainpipeRetryPolicyMixin

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.triggers.base import BaseTrigger


class DataSnapshotSensor(TrainpipeRetryPolicyMixin, BaseSensorOperator):
    """Wait until the run's partition `<data.uri>/<partition>/` is complete.

    Complete means the writer's marker file exists (`data.wait.marker`, `_SUCCESS` by default)
    and/or the partition's files hold at least `data.wait.min_rows` rows, read from file footers.
    For a `sql` source: the query, rendered for the run's own day (the last slot of a window),
    returns at least `min_rows` rows (a `COUNT(*)` the database runs). For a `delta` source: the
    table's current version holds at least `min_rows` rows in the window (a file the log's
    statistics place wholly inside it is counted from its Parquet footer, the others stream the
    time column). For an `iceberg` source: the table's current snapshot holds them (a file whose
    partition lies wholly inside the window is counted from its manifest entry, the others read
    the time column).
    Works on `file://` and `s3://`; with `conn_id` the credentials and endpoint come from that
    Airflow connection (an AWS connection for s3://), as with ObjectStoragePath.

    :param data: the pipeline's `data` section; `wait` gives the rule, mode, interval and timeout.
    :param partition: sub-path of the run's snapshot (templated); default `data.partition`.
    :param conn_id: Airflow connection for the storage (e.g. `aws_default`); default: environment.
    :param deferrable: wait in the triggerer; default: `data.wait.mode == "deferrable"`.
    """

    template_fields: Sequence[str] = ("partition", "conn_id")
    ui_color = "#d6eaf8"

    def __init__(
        self,
        *,
        data: DataSection,
        partition: str | None = None,
        conn_id: str | None = None,
        deferrable: bool | None = None,
        **kwargs: Any,
    ) -> None:
        wait = data.wait
        kwargs.setdefault("mode", "reschedule" if wait.mode == "reschedule" else "poke")
        kwargs.setdefault("poke_interval", wait.poke_interval)
        kwargs.setdefault("timeout", wait.timeout)
        super().__init__(**kwargs)
        self.data = data
        self.partition = partition if partition is not None else data.partition
        self.conn_id = conn_id
        self.deferrable = wait.mode == "deferrable" if deferrable is None else deferrable

    @property
    def partition_uri(self) -> str:
        from airflow_trainpipe.data.snapshots.partitions import partition_uri

        return partition_uri(self.data, self.partition)

    def _wait(self, context: Context) -> dict[str, Any]:
        """What the source kind waits for on this run: its own slot (a partition, a day of rows)."""
        from airflow_trainpipe.data.sources import source_kind

        return source_kind(self.data.source.kind).wait(
            self.data, context, self.partition, self.render_template, self.conn_id
        )

    def _ready(self, context: Context) -> tuple[bool, str]:
        from airflow_trainpipe.data.sources import source_kind

        return source_kind(self.data.source.kind).ready(self._wait(context))

    def poke(self, context: Context) -> bool:
        ready, reason = self._ready(context)
        self.log.info("%s: %s", "complete" if ready else "not complete", reason)
        return ready

    def execute(self, context: Context) -> str:
        # The rendered partition first, outside the poke loop: a path that leaves data.uri is the
        # run's own input gone wrong (the form, a conf), not a failed poke. Inside the loop
        # silent_fail would poke it again until the timeout and soft_fail would skip the run.
        from airflow_trainpipe.data.snapshots.partitions import partition_uri

        partition_uri(self.data, self.partition)  # PartitionError: not retryable, never a skip
        if not self.deferrable:
            super().execute(context)
            return self.partition_uri
        if self.poke(context):
            return self.partition_uri
        self.defer(
            trigger=self._trigger(context),
            method_name="execute_complete",
            timeout=timedelta(seconds=_seconds(self.timeout)),
        )
        raise AssertionError("defer() returned")  # pragma: no cover - defer always raises

    def _trigger(self, context: Context) -> BaseTrigger:
        from airflow_trainpipe.triggers.source_rows import SourceRowsTrigger

        return SourceRowsTrigger(
            kind=self.data.source.kind, wait=self._wait(context), poke_interval=_seconds(self.poke_interval)
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> str:
        if not event or event.get("status") != "ready":
            raise AirflowException(
                f"waiting for {self.partition_uri} failed: {(event or {}).get('message', 'no event')}"
            )
        self.log.info("complete: %s", event["message"])
        return self.partition_uri


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)
