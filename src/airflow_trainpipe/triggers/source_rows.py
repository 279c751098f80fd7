"""SourceRowsTrigger: the deferrable wait of DataSnapshotSensor, run in the triggerer.

One trigger for every source kind: the sensor hands it the kind's name and what the kind waits
for (`SourceKind.wait`, plain JSON), and it asks the kind's `ready` every `poke_interval`, the
check the sensor's poke makes. A kind's check is blocking I/O (fsspec, a database driver,
delta-rs, pyiceberg), so `PollingTrigger` runs it in a worker thread. A store that cannot be
reached (`SourceUnavailable`) is asked again next interval; any other error (a table or column
that does not exist, a query the database refuses) ends the wait, and the task reports it.
"""

from __future__ import annotations

from typing import Any

from airflow_trainpipe.data.sources.errors import SourceUnavailable
from airflow_trainpipe.triggers.polling import PollingTrigger


class SourceRowsTrigger(PollingTrigger):
    """Fires once the run's rows are there by its source kind's rule."""

    keep_waiting_on = (SourceUnavailable,)

    def __init__(self, *, kind: str, wait: dict[str, Any], poke_interval: float = 300.0) -> None:
        super().__init__()
        self.kind = kind
        self.wait = wait
        self.poke_interval = poke_interval

    def _arguments(self) -> dict[str, Any]:
        return {"kind": self.kind, "wait": self.wait, "poke_interval": self.poke_interval}

    def _ready(self) -> tuple[bool, str]:
        from airflow_trainpipe.data.sources import source_kind

        return source_kind(self.kind).ready(self.wait)
