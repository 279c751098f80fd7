"""DeltaRowsTrigger: the deferrable wait of DataSnapshotSensor on a `delta` source."""

from __future__ import annotations

from airflow_trainpipe.data.sources.sql import SourceUnavailable
from airflow_trainpipe.triggers.polling import WindowRowsTrigger


class DeltaRowsTrigger(WindowRowsTrigger):
    """Fires once the table's current version holds `min_rows` rows in the run's window.

    delta-rs and the Arrow scan block, so the count runs in a worker thread: the triggerer's event
    loop serves every deferred task of the deployment. A table or column that does not exist ends
    the wait at once (the task reports it); storage that cannot be reached is asked again next
    interval. The source travels as its config (a dict), the window as ISO timestamps.
    """

    keep_waiting_on = (SourceUnavailable,)

    def _ready(self) -> tuple[bool, str]:
        from airflow_trainpipe.config.sources import DeltaSource
        from airflow_trainpipe.data.sources.delta import rows_ready

        return rows_ready(DeltaSource.model_validate(self.source), self._window(), self.min_rows)
