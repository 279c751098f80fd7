"""DataSnapshotTrigger: the deferrable wait of DataSnapshotSensor, run in the triggerer."""

from __future__ import annotations

from typing import Any

from airflow_trainpipe.triggers.polling import PollingTrigger


class DataSnapshotTrigger(PollingTrigger):
    """Fires once the partition is complete by the same rule the sensor pokes with (fsspec I/O,
    in a worker thread)."""

    def __init__(
        self,
        *,
        uri: str,
        format: str,
        marker: str | None,
        min_rows: int | None,
        conn_id: str | None = None,
        poke_interval: float = 300.0,
    ) -> None:
        super().__init__()
        self.uri = uri
        self.format = format
        self.marker = marker
        self.min_rows = min_rows
        self.conn_id = conn_id
        self.poke_interval = poke_interval

    def _arguments(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "format": self.format,
            "marker": self.marker,
            "min_rows": self.min_rows,
            "conn_id": self.conn_id,
            "poke_interval": self.poke_interval,
        }

    def _ready(self) -> tuple[bool, str]:
        from airflow_trainpipe.data.snapshots.manifests import partition_ready

        return partition_ready(self.uri, self.format, self.marker, self.min_rows, self.conn_id)
