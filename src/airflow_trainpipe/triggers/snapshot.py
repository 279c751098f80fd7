"""DataSnapshotTrigger: the deferrable wait of DataSnapshotSensor, run in the triggerer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class DataSnapshotTrigger(BaseTrigger):
    """Fires once the partition is complete by the same rule the sensor pokes with.

    The check is blocking fsspec I/O, so it runs in a worker thread: the triggerer's event loop
    serves every deferred task of the deployment and must never block.
    """

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

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "uri": self.uri,
                "format": self.format,
                "marker": self.marker,
                "min_rows": self.min_rows,
                "conn_id": self.conn_id,
                "poke_interval": self.poke_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_trainpipe.snapshot import partition_ready

        while True:
            try:
                ready, reason = await asyncio.to_thread(
                    partition_ready, self.uri, self.format, self.marker, self.min_rows, self.conn_id
                )
            except Exception as exc:  # the task, not the triggerer, reports it
                yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
                return
            if ready:
                yield TriggerEvent({"status": "ready", "message": reason})
                return
            self.log.info("waiting: %s", reason)
            await asyncio.sleep(self.poke_interval)
