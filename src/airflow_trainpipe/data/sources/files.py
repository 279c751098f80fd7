"""The `files` source: the run's partition (or a window's partitions) of Parquet or CSV files
under `data.uri`, read where they lie and copied into the snapshot store only with `data.freeze`.

Complete means the writer's marker file exists (`data.wait.marker`) and/or the partition's files
hold `data.wait.min_rows` rows, read from the file footers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.core.storage import resolve
from airflow_trainpipe.data.sources.base import Render, SourceKind

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.config.data import DataSection
    from airflow_trainpipe.contracts.manifest import Manifest


class FilesKind(SourceKind):
    name = "files"
    exported = False

    def describe(self, data: DataSection) -> str:
        return f"data.source files ({resolve(data.uri)})"

    def wait(
        self,
        data: DataSection,
        context: Mapping[str, Any],
        partition: str,
        render: Render,
        conn_id: str | None,
    ) -> dict[str, Any]:
        from airflow_trainpipe.data.snapshots.partitions import partition_uri

        return {
            "uri": partition_uri(data, partition),
            "format": data.format,
            "marker": data.wait.marker,
            "min_rows": data.wait.min_rows,
            "conn_id": conn_id,
        }

    def ready(self, wait: Mapping[str, Any]) -> tuple[bool, str]:
        from airflow_trainpipe.data.snapshots.partitions import partition_ready

        return partition_ready(wait["uri"], wait["format"], wait["marker"], wait["min_rows"], wait["conn_id"])

    def snapshot(
        self,
        config: PipelineConfig,
        context: Mapping[str, Any],
        partition: str,
        render: Render,
        conn_id: str | None,
    ) -> Manifest:
        """The partition (or the window's partitions) as they are now; with `data.freeze: true`
        copied into the store, unless a feature store's joined rows are what gets frozen."""
        from airflow_trainpipe.data.snapshots.manifests import resolve_window
        from airflow_trainpipe.data.snapshots.store import freeze_manifest
        from airflow_trainpipe.data.window import run_partitions

        data = config.data
        manifest = resolve_window(data, run_partitions(data, context, partition, render), conn_id)
        if data.freeze is True and data.feature_store is None:  # `versions` pinned them as they resolved
            return freeze_manifest(config, manifest, conn_id)
        return manifest


KIND = FilesKind()
