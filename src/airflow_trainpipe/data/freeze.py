"""The run's snapshot, frozen: the one coordinator of the data path.

Its source kind gives the rows (`data.sources`), frozen into the snapshot store where the kind
exports them (`data.snapshots`); with `data.feature_store` those are the entity rows, and the
snapshot is them joined with the store's features, frozen (`data.feature_store`). Validation
(`data.validation`) then checks what this returns; training reads exactly those files.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.data.sources import source_kind

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.contracts.manifest import Manifest
    from airflow_trainpipe.data.sources.base import Render


def freeze_run(
    config: PipelineConfig,
    context: Mapping[str, Any],
    partition: str,
    render: Render,
    conn_id: str | None = None,
) -> Manifest:
    """The run's snapshot, as its source holds it now, unvalidated. `partition` is the run's,
    rendered; `conn_id` is the storage's. A source's error names the pipeline and the source."""
    kind = source_kind(config.data.source.kind)
    with named_errors(config, kind.describe(config.data)):
        entity = kind.snapshot(config, context, partition, render, conn_id)
    feature_store = config.data.feature_store
    if feature_store is None:
        return entity
    from airflow_trainpipe.data.feature_store.join import join_features

    with named_errors(config, f"data.feature_store ({feature_store.selection})"):
        return join_features(config, entity, context, conn_id)


def snapshot_for_date(config: PipelineConfig, ds: str) -> Manifest:
    """The snapshot a run on `ds` outside Airflow reads (the CLI), as the DAG's run of that date
    would (unvalidated)."""
    from airflow_trainpipe.config.templates import date_names, render

    names = date_names(ds)
    return freeze_run(config, names, render(config.data.partition, names), render)


@contextmanager
def named_errors(config: PipelineConfig, source: str) -> Iterator[None]:
    """A source's error, prefixed with the pipeline and the source; the same class, so the retry
    policy still reads `retryable`."""
    from airflow_trainpipe.data.sources.errors import SourceError

    try:
        yield
    except SourceError as exc:
        named = type(exc)(f"pipeline {config.pipeline}, {source}: {exc}")
        named.__dict__.update(exc.__dict__)  # a subclass's own fields (a feature store error's kind)
        raise named from exc
