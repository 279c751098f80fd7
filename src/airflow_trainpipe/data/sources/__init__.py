"""Where a run's rows come from (`data.source`), frozen into the snapshot it validates and trains on.

Light on purpose: operators import it in `execute()`; each kind imports its drivers when used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.config.data import DataSection
    from airflow_trainpipe.contracts.manifest import Manifest

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
    `delta` table's current version, an `iceberg` table's current snapshot) exported into the
    snapshot store. With `data.feature_store`, those are the entity rows, and the snapshot is
    them joined with the store's features, frozen. `partition` is the run's, rendered;
    `conn_id` is the storage's. A source's error names the pipeline and the source."""
    feature_store = config.data.feature_store
    entity = _source_snapshot(config, context, partition, render, conn_id, copy=feature_store is None)
    if feature_store is None:
        return entity
    from airflow_trainpipe.data.feature_store.join import join_features

    with named_errors(config, f"data.feature_store ({feature_store.selection})"):
        return join_features(config, entity, context, conn_id)


def _source_snapshot(
    config: PipelineConfig,
    context: Mapping[str, Any],
    partition: str,
    render: Render,
    conn_id: str | None,
    *,
    copy: bool,
) -> Manifest:
    """The source's rows for the run; `copy`: a `files` source with `data.freeze: true` has
    them copied into the store (a feature-store run freezes the joined rows instead)."""
    data = config.data
    source = data.source
    if source.kind in ("delta", "iceberg"):
        from airflow_trainpipe.data.sources import freeze
        from airflow_trainpipe.data.sources.sql import run_window as table_window

        window = table_window(data, context, partition, render)
        where = (
            f"data.source delta ({source.uri})"
            if source.kind == "delta"
            else f"data.source iceberg ({source.table}, connection {source.conn_id})"
        )
        with named_errors(config, where):
            return freeze.table_snapshot(config, partition, window, conn_id)
    if source.kind == "sql":
        from airflow_trainpipe.data.snapshots.store import sql_snapshot
        from airflow_trainpipe.data.sources.sql import run_window as sql_window

        window = sql_window(data, context, partition, render)
        query = str(render(source.query, {**context, **window.names()}))
        with named_errors(config, f"data.source sql ({source.conn_id})"):
            return sql_snapshot(config, partition, window, query, conn_id)
    from airflow_trainpipe.data.snapshots.manifests import resolve_window
    from airflow_trainpipe.data.window import run_window

    manifest = resolve_window(data, run_window(data, context, partition, render), conn_id)
    if copy and data.freeze is True:  # `versions` pinned each file's version as it resolved it
        from airflow_trainpipe.data.snapshots.store import freeze_manifest

        return freeze_manifest(config, manifest, conn_id)
    return manifest


@contextmanager
def named_errors(config: PipelineConfig, source: str) -> Iterator[None]:
    """A source's error, prefixed with the pipeline and the source; the same class, so the retry
    policy still reads `retryable`."""
    from airflow_trainpipe.data.sources.sql import SourceError

    try:
        yield
    except SourceError as exc:
        named = type(exc)(f"pipeline {config.pipeline}, {source}: {exc}")
        named.__dict__.update(exc.__dict__)  # a subclass's own fields (a feature store error's kind)
        raise named from exc


def rendered_query(
    data: DataSection, context: Mapping[str, Any], partition: str, render: Render, *, own_slot: bool = False
) -> str:
    """The `sql` source's query for the run, its window filled in; with `own_slot`, the run's own
    day (slot) only: what `wait_for_data` waits for, as it waits for a files run's own partition."""
    from airflow_trainpipe.data.sources.sql import run_window as sql_window

    assert data.source.kind == "sql"
    window = sql_window(data, context, partition, render, slots=1 if own_slot else None)
    return str(render(data.source.query, {**context, **window.names()}))
