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

    from airflow_trainpipe.data.sources.sql import SqlWindow


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
        from airflow_trainpipe.data.snapshots.manifests import partition_uri

        return partition_uri(self.data, self.partition)

    def _ready(self, context: Context) -> tuple[bool, str]:
        from airflow_trainpipe.data.snapshots.manifests import partition_ready

        wait, source = self.data.wait, self.data.source
        if source.kind == "sql":
            from airflow_trainpipe.data.sources.sql import rows_ready

            return rows_ready(source.conn_id, self._query(context), wait.min_rows or 1)
        if source.kind == "delta":
            from airflow_trainpipe.data.sources import delta

            return delta.rows_ready(source, self._window(context), wait.min_rows or 1)
        if source.kind == "iceberg":
            from airflow_trainpipe.data.sources import iceberg

            return iceberg.rows_ready(source, self._window(context), wait.min_rows or 1)
        return partition_ready(self.partition_uri, self.data.format, wait.marker, wait.min_rows, self.conn_id)

    def _query(self, context: Context) -> str:
        """A `sql` source's query for the run's own day: earlier days of a window landed before."""
        from airflow_trainpipe.data.sources import rendered_query

        return rendered_query(self.data, context, self.partition, self.render_template, own_slot=True)

    def _window(self, context: Context) -> SqlWindow:
        """A table source's slot to wait for: the run's own day, the window's last (earlier
        days landed before, as a files source waits for its own partition only)."""
        from airflow_trainpipe.data.sources.sql import run_window

        return run_window(self.data, context, self.partition, self.render_template, slots=1)

    def poke(self, context: Context) -> bool:
        ready, reason = self._ready(context)
        self.log.info("%s: %s", "complete" if ready else "not complete", reason)
        return ready

    def execute(self, context: Context) -> str:
        # The rendered partition first, outside the poke loop: a path that leaves data.uri is the
        # run's own input gone wrong (the form, a conf), not a failed poke. Inside the loop
        # silent_fail would poke it again until the timeout and soft_fail would skip the run.
        from airflow_trainpipe.data.snapshots.manifests import partition_uri

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
        wait, interval = self.data.wait, _seconds(self.poke_interval)
        if self.data.source.kind in ("delta", "iceberg"):
            from airflow_trainpipe.triggers.delta import DeltaRowsTrigger
            from airflow_trainpipe.triggers.iceberg import IcebergRowsTrigger

            window = self._window(context)
            trigger = DeltaRowsTrigger if self.data.source.kind == "delta" else IcebergRowsTrigger
            return trigger(
                source=self.data.source.model_dump(mode="json"),
                window_start=window.start.isoformat(),
                window_end=window.end.isoformat(),
                min_rows=wait.min_rows or 1,
                poke_interval=interval,
            )
        if self.data.source.kind == "sql":
            from airflow_trainpipe.triggers.sql import SqlRowsTrigger

            return SqlRowsTrigger(
                conn_id=self.data.source.conn_id,
                query=self._query(context),
                min_rows=wait.min_rows or 1,
                poke_interval=interval,
            )
        from airflow_trainpipe.triggers.snapshot import DataSnapshotTrigger

        return DataSnapshotTrigger(
            uri=self.partition_uri,
            format=self.data.format,
            marker=wait.marker,
            min_rows=wait.min_rows,
            conn_id=self.conn_id,
            poke_interval=interval,
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
