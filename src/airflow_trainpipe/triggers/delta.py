"""DeltaRowsTrigger: the deferrable wait of DataSnapshotSensor on a `delta` source."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow_trainpipe.sources.sql import SourceUnavailable
from airflow_trainpipe.triggers.polling import PollingTrigger


class DeltaRowsTrigger(PollingTrigger):
    """Fires once the table's current version holds `min_rows` rows in the run's window.

    delta-rs and the Arrow scan block, so the count runs in a worker thread: the triggerer's event
    loop serves every deferred task of the deployment. A table or column that does not exist ends
    the wait at once (the task reports it); storage that cannot be reached is asked again next
    interval. The source travels as its config (a dict), the window as ISO timestamps.
    """

    keep_waiting_on = (SourceUnavailable,)

    def __init__(
        self,
        *,
        source: dict[str, Any],
        window_start: str,
        window_end: str,
        min_rows: int,
        poke_interval: float = 300.0,
    ) -> None:
        super().__init__()
        self.source = source
        self.window_start = window_start
        self.window_end = window_end
        self.min_rows = min_rows
        self.poke_interval = poke_interval

    def _arguments(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "window_start": self.window_start,
            "window_end": self.window_end,
            "min_rows": self.min_rows,
            "poke_interval": self.poke_interval,
        }

    def _ready(self) -> tuple[bool, str]:
        from airflow_trainpipe.config.sources import DeltaSource
        from airflow_trainpipe.sources.delta import rows_ready
        from airflow_trainpipe.sources.sql import SqlWindow

        window = SqlWindow(datetime.fromisoformat(self.window_start), datetime.fromisoformat(self.window_end))
        return rows_ready(DeltaSource.model_validate(self.source), window, self.min_rows)
