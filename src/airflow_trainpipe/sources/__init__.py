"""Where a run's rows come from (`data.source`), frozen into the snapshot it validates and trains on.

Light on purpose: operators import it in `execute()`; each kind imports its drivers when used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.config.data import DataSection
    from airflow_trainpipe.snapshot import Manifest

Render = Callable[[str, Any], Any]
"""Renders a template in a context: an operator's `render_template`, or the CLI's."""


def freeze_run(
    config: PipelineConfig,
    context: Mapping[str, Any],
    partition: str,
    render: Render,
    conn_id: str | None = None,
) -> Manifest:
    """The run's snapshot, as its source holds it now, unvalidated: the partition (or the
    window's partitions) of a `files` source, or the window's rows of a `sql` source (or of a
    `delta` table's current version) exported into the snapshot store. `partition` is the run's,
    rendered; `conn_id` is the storage's."""
    data = config.data
    if data.source.kind == "delta":
        from airflow_trainpipe.sources.freeze import delta_snapshot
        from airflow_trainpipe.sources.sql import run_window as delta_window

        return delta_snapshot(config, partition, delta_window(data, context, partition, render), conn_id)
    if data.source.kind == "sql":
        from airflow_trainpipe.sources.freeze import sql_snapshot
        from airflow_trainpipe.sources.sql import SourceError
        from airflow_trainpipe.sources.sql import run_window as sql_window

        window = sql_window(data, context, partition, render)
        query = str(render(data.source.query, {**context, **window.names()}))
        try:
            return sql_snapshot(config, partition, window, query, conn_id)
        except SourceError as exc:  # the same class: the retry policy still reads `retryable`
            where = f"pipeline {config.pipeline}, data.source sql ({data.source.conn_id})"
            raise type(exc)(f"{where}: {exc}") from exc
    from airflow_trainpipe.snapshot import resolve_window
    from airflow_trainpipe.window import run_window

    manifest = resolve_window(data, run_window(data, context, partition, render), conn_id)
    if data.freeze is True:  # `versions` pinned each file's version as it resolved it
        from airflow_trainpipe.sources.freeze import freeze_manifest

        return freeze_manifest(config, manifest, conn_id)
    return manifest


def rendered_query(
    data: DataSection, context: Mapping[str, Any], partition: str, render: Render, *, own_slot: bool = False
) -> str:
    """The `sql` source's query for the run, its window filled in; with `own_slot`, the run's own
    day (slot) only: what `wait_for_data` waits for, as it waits for a files run's own partition."""
    from airflow_trainpipe.sources.sql import run_window as sql_window

    assert data.source.kind == "sql"
    window = sql_window(data, context, partition, render, slots=1 if own_slot else None)
    return str(render(data.source.query, {**context, **window.names()}))
