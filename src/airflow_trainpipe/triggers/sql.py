"""SqlRowsTrigger: the deferrable wait of DataSnapshotSensor on a `sql` source."""

from __future__ import annotations

from typing import Any

from airflow_trainpipe.data.sources.sql import SourceUnavailable
from airflow_trainpipe.triggers.polling import PollingTrigger


class SqlRowsTrigger(PollingTrigger):
    """Fires once the run's query returns `min_rows` rows, counted by the database. A query the
    database refuses ends the wait at once; a database that cannot be reached is asked again."""

    keep_waiting_on = (SourceUnavailable,)

    def __init__(self, *, conn_id: str, query: str, min_rows: int, poke_interval: float = 300.0) -> None:
        super().__init__()
        self.conn_id = conn_id
        self.query = query
        self.min_rows = min_rows
        self.poke_interval = poke_interval

    def _arguments(self) -> dict[str, Any]:
        return {
            "conn_id": self.conn_id,
            "query": self.query,
            "min_rows": self.min_rows,
            "poke_interval": self.poke_interval,
        }

    def _ready(self) -> tuple[bool, str]:
        from airflow_trainpipe.data.sources.sql import rows_ready

        return rows_ready(self.conn_id, self.query, self.min_rows)
