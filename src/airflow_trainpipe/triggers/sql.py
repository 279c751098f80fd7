"""SqlRowsTrigger: the deferrable wait of DataSnapshotSensor on a `sql` source."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class SqlRowsTrigger(BaseTrigger):
    """Fires once the run's query returns `min_rows` rows, counted by the database.

    The driver is blocking, so the count runs in a worker thread: the triggerer's event loop
    serves every deferred task of the deployment. A query the database refuses ends the wait at
    once (the task reports it); a database that cannot be reached is asked again next interval.
    """

    def __init__(self, *, conn_id: str, query: str, min_rows: int, poke_interval: float = 300.0) -> None:
        super().__init__()
        self.conn_id = conn_id
        self.query = query
        self.min_rows = min_rows
        self.poke_interval = poke_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "conn_id": self.conn_id,
                "query": self.query,
                "min_rows": self.min_rows,
                "poke_interval": self.poke_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_trainpipe.sources.sql import SourceUnavailable, rows_ready

        while True:
            try:
                ready, reason = await asyncio.to_thread(rows_ready, self.conn_id, self.query, self.min_rows)
            except SourceUnavailable as exc:
                ready, reason = False, str(exc)
            except Exception as exc:  # the task, not the triggerer, reports it
                yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
                return
            if ready:
                yield TriggerEvent({"status": "ready", "message": reason})
                return
            self.log.info("waiting: %s", reason)
            await asyncio.sleep(self.poke_interval)
