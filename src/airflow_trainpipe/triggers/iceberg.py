"""IcebergRowsTrigger: the deferrable wait of DataSnapshotSensor on an `iceberg` source."""

from __future__ import annotations

from airflow_trainpipe.data.sources.sql import SourceUnavailable
from airflow_trainpipe.triggers.polling import WindowRowsTrigger


class IcebergRowsTrigger(WindowRowsTrigger):
    """Fires once the table's current snapshot holds `min_rows` rows in the run's window.

    The catalog call and the scan planning block (pyiceberg is synchronous), so the count runs in a
    worker thread: the triggerer's event loop serves every deferred task of the deployment. An
    undefined connection, a table or column that does not exist ends the wait at once (the task
    reports it); a catalog or storage that cannot be reached is asked again next interval. The
    source travels as its config (a dict), the window as ISO timestamps.
    """

    keep_waiting_on = (SourceUnavailable,)

    def _ready(self) -> tuple[bool, str]:
        from airflow_trainpipe.config.sources import IcebergSource
        from airflow_trainpipe.data.sources.iceberg import rows_ready

        return rows_ready(IcebergSource.model_validate(self.source), self._window(), self.min_rows)
