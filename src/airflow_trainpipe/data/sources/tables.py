"""What the table kinds (`delta`, `iceberg`) share: the run's window of the table's current
version, waited for by counting its rows and exported sorted into the snapshot store.

The source travels to the triggerer as its config (a dict), the window as ISO timestamps.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.data.sources.base import TABLE_REMEDY, Render, SourceKind, freeze_export
from airflow_trainpipe.data.window import TimeWindow, run_time_window

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.config.data import DataSection
    from airflow_trainpipe.config.sources import TableSource
    from airflow_trainpipe.contracts.manifest import Manifest


class TableKind(SourceKind):
    @abstractmethod
    def source_config(self, document: Mapping[str, Any]) -> TableSource:
        """The source's config, read back from the trigger's arguments."""

    @abstractmethod
    def rows_ready(self, source: TableSource, window: TimeWindow, min_rows: int) -> tuple[bool, str]: ...

    @abstractmethod
    def export(self, source: TableSource, window: TimeWindow, folder: Path) -> Any:
        """The window's rows written as sorted Parquet files into `folder`: files, schema, scan."""

    def wait(
        self,
        data: DataSection,
        context: Mapping[str, Any],
        partition: str,
        render: Render,
        conn_id: str | None,
    ) -> dict[str, Any]:
        window = run_time_window(data, context, partition, render, slots=1)
        return {
            "source": data.source.model_dump(mode="json"),
            "window_start": window.start.isoformat(),
            "window_end": window.end.isoformat(),
            "min_rows": data.wait.min_rows or 1,
        }

    def ready(self, wait: Mapping[str, Any]) -> tuple[bool, str]:
        window = TimeWindow(
            datetime.fromisoformat(wait["window_start"]), datetime.fromisoformat(wait["window_end"])
        )
        return self.rows_ready(self.source_config(wait["source"]), window, wait["min_rows"])

    def snapshot(
        self,
        config: PipelineConfig,
        context: Mapping[str, Any],
        partition: str,
        render: Render,
        conn_id: str | None,
    ) -> Manifest:
        """The window's rows of the table's current version (snapshot), frozen, in a manifest that
        names the table, its version and the filter. `conn_id` is the snapshot store's; the
        table's own is `data.source.conn_id`."""
        from airflow_trainpipe.config.sources import DeltaSource, IcebergSource
        from airflow_trainpipe.contracts.manifest import SourceLineage

        source = config.data.source
        assert isinstance(source, DeltaSource | IcebergSource)
        window = run_time_window(config.data, context, partition, render)

        def export(folder: Path) -> tuple[Any, Any, SourceLineage]:
            exported = self.export(source, window, folder)
            lineage = SourceLineage(
                kind=self.name,
                conn_id=source.conn_id,
                window_start=window.start.isoformat(),
                window_end=window.end.isoformat(),
                filter=exported.scan.filter_text,
                **exported.scan.lineage,
            )
            return exported.files, exported.schema, lineage

        return freeze_export(config, partition, export, TABLE_REMEDY, conn_id)
