"""What every source kind shares: the interface a kind implements, and what the exported kinds
do alike (export into a scratch folder, check the columns, freeze the files, store the manifest).

A kind is one object per `data.source.kind` (`KIND` in `data.sources.<kind>`): whether the run's
rows are there (`wait` + `ready`, the same check for the sensor's poke and its deferrable
trigger), the run's snapshot (`snapshot`), and what its lineage says (`lineage_tags`, `origin`).
A new kind is one module here and its config model in `config.sources`; nothing else changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_trainpipe.contracts.tags import DATA_WINDOW_TAG

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.config.data import DataSection
    from airflow_trainpipe.contracts.manifest import Manifest, SourceLineage
    from airflow_trainpipe.data.sources.parquet_export import ExportedFile

Render = Callable[[str, Any], Any]
"""Renders a template in a context: an operator's `render_template`, or the CLI's."""

# What a mistyped numeric feature asks of a query, and of a table (the export has no query).
QUERY_REMEDY = "cast it to a number in the query"
TABLE_REMEDY = "cast it to a number in the table, or list it in data.features.categorical"


class SourceKind(ABC):
    """One kind of `data.source`. Stateless: the config and the run's context are arguments."""

    name: ClassVar[str]
    exported: ClassVar[bool] = True
    """Whether a run exports its rows into the snapshot store and validates them there. A `files`
    source is validated where it lies, partition by partition, and copied only with `data.freeze`."""

    @abstractmethod
    def describe(self, data: DataSection) -> str:
        """The source as an error names it, e.g. `data.source sql (warehouse)`."""

    @abstractmethod
    def wait(
        self,
        data: DataSection,
        context: Mapping[str, Any],
        partition: str,
        render: Render,
        conn_id: str | None,
    ) -> dict[str, Any]:
        """What `wait_for_data` waits for, as JSON: the run's own slot (earlier ones of a window
        landed before). The sensor's poke and its deferrable trigger both check it with `ready`."""

    @abstractmethod
    def ready(self, wait: Mapping[str, Any]) -> tuple[bool, str]:
        """Whether `wait`'s rows are there, and the reason either way (for the log). Blocking I/O:
        the trigger runs it in a worker thread."""

    @abstractmethod
    def snapshot(
        self,
        config: PipelineConfig,
        context: Mapping[str, Any],
        partition: str,
        render: Render,
        conn_id: str | None,
    ) -> Manifest:
        """The run's rows as the source holds them now, in a stored manifest (unvalidated).
        `partition` is the run's, rendered; `conn_id` is the snapshot storage's."""

    def lineage_tags(self, lineage: SourceLineage) -> dict[str, str]:
        """The MLflow tags of where an exported snapshot's rows came from, beside its window."""
        return {}

    def origin(self, lineage: SourceLineage) -> str:
        """What the rows were read from, for logs."""
        return str(lineage.conn_id)

    def lineage_datasets(self, data: DataSection, manifest: Manifest) -> list[SourceDataset]:
        """The datasets a snapshot's rows were read from, named as OpenLineage names them (the
        `openlineage` room turns them into events): by default the partitions it was read from,
        the window's that existed, or the run's own (wherever its files were frozen or joined to)."""
        from airflow_trainpipe.core.storage import dataset_name
        from airflow_trainpipe.data.snapshots.partitions import partition_uri

        uris = [partition_uri(data, p) for p in manifest.window] or [manifest.partition_uri]
        return [SourceDataset(*dataset_name(uri)) for uri in uris]


@dataclass(frozen=True)
class SourceDataset:
    """A dataset a snapshot was read from: OpenLineage's namespace and name, and the version the
    rows were read at where the source has versions (a Delta table version, an Iceberg snapshot)."""

    namespace: str
    name: str
    version: str | None = None


def window_tag(lineage: SourceLineage) -> dict[str, str]:
    return {DATA_WINDOW_TAG: f"{lineage.window_start} .. {lineage.window_end}"}


def freeze_export(
    config: PipelineConfig,
    partition: str,
    export: Callable[[Path], tuple[list[ExportedFile], pa.Schema, SourceLineage]],
    remedy: str,
    conn_id: str | None,
) -> Manifest:
    """An exported kind's snapshot: `export` writes the window's rows into a scratch folder, the
    columns are checked before anything is frozen, the files go into the content-addressed store
    and the manifest that reads them is stored."""
    from airflow_trainpipe.data.snapshots.store import freeze_file, scratch_folder, store_export

    with scratch_folder(config) as folder:
        exported, schema, lineage = export(folder)
        check_columns(config, schema, remedy, entity_rows=True)
        files = [freeze_file(f.path, f.rows, config.snapshots.uri, conn_id) for f in exported]
    return store_export(config, partition, files, schema, lineage, conn_id)


def check_columns(
    config: PipelineConfig, schema: pa.Schema, remedy: str = QUERY_REMEDY, *, entity_rows: bool = False
) -> None:
    """The columns the pipeline reads are in the result, numeric features as numbers: caught
    here, before anything is frozen, rather than as a transform error inside the training job.
    `entity_rows`: the source's own rows; with a feature store they need the label, the keys, the
    event time and only the features that are not the store's (all are checked once joined)."""
    import pyarrow.types as pat

    from airflow_trainpipe.data.sources.errors import SourceError

    data = config.data
    features = data.features.all
    if entity_rows and data.feature_store is not None:
        features = [name for name in features if name in schema.names] + [data.feature_store.timestamp_column]
    needed = [data.label, *features, *filter(None, [data.group, data.holdout.key_column])]
    if missing := [name for name in needed if name not in schema.names]:
        raise SourceError(
            f"the result has no column {', '.join(map(repr, missing))}, which the pipeline reads "
            f"(it returns {', '.join(schema.names)})"
        )
    numeric = (pat.is_integer, pat.is_floating, pat.is_decimal, pat.is_boolean)
    for name in (n for n in data.features.numeric if n in features):
        kind = schema.field(name).type
        if not any(test(kind) for test in numeric):
            raise SourceError(f"numeric feature {name!r} is {kind} in the result; {remedy}")
