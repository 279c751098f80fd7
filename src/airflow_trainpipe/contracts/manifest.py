"""A snapshot's manifest: the exact files a run validates and trains on, and where they came from.

A manifest lists every data file with its size, sha256 and row count, the snapshot's schema and
row total, and the digest over the files' contents (`core.digest.combine`). The digest is the data
version: it is tagged on the MLflow run and the registered model, and training reads exactly the
manifest's files, so a model can be traced to, and retrained on, the bytes it saw. It crosses
tasks (validate -> train, inside the payloads) and processes (inside the train spec), so it is a
contract: pydantic only, validated on read, built by `data.snapshots` and the source kinds.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SnapshotFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    uri: str
    size: int
    sha256: str
    rows: int


class SourceLineage(BaseModel):
    """Where a non-file snapshot's rows came from: lineage only. Reproducing reads the frozen
    files, never the source again (its rows and versions change and expire).

    Fields of one kind are None for the other; a manifest stored before a field existed reads
    with it None (every field after `kind` but the window is optional)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    """`sql`, `delta` or `iceberg`."""
    conn_id: str | None = None
    """sql: the database's Airflow connection; delta: the table storage's (None: the environment);
    iceberg: the catalog's."""
    query: str | None = None
    """sql: the query as run, its window filled in (without the ORDER BY the export adds)."""
    window_start: str
    window_end: str
    table: str | None = None
    """delta: the table's URI; iceberg: its identifier in the catalog (`namespace.table`)."""
    version: int | None = None
    """delta: the table version the rows were read at (the first one that gave these bytes, when
    a later version gave them again: the manifest is stored once per digest)."""
    filter: str | None = None
    """delta: the row filter as evaluated (Arrow's expression text); iceberg: the row filter the
    scan was given (pyiceberg's filter syntax)."""
    snapshot_id: int | None = None
    """iceberg: the snapshot the rows were read at (the first one that gave these bytes, when a
    later snapshot gave them again: the manifest is stored once per digest)."""

    @property
    def origin(self) -> str:
        """What the rows were read from, for logs: a connection, or a table at a version."""
        if self.kind == "delta":
            return f"{self.table} at version {self.version}"
        if self.kind == "iceberg":
            return f"{self.table} of catalog {self.conn_id} at snapshot {self.snapshot_id}"
        return str(self.conn_id)


class FeatureViewLineage(BaseModel):
    """One Feast feature view a snapshot's features were joined from, as it was defined then."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: str
    """Hash of the view's definition (its Feast spec): any change to it (a feature, its type, the
    TTL, the source) changes the hash."""
    ttl_seconds: int
    """The view's TTL (0: none)."""
    join_keys: list[str]
    dtypes: dict[str, str]
    """Each of the view's features -> its Feast type, as the view declared it."""


class FeatureLineage(BaseModel):
    """What a feature-store snapshot joined: the Feast project, the references, the views'
    definitions, and the entity rows they were joined to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    project: str
    repo: str
    feature_service: str | None = None
    features: list[str]
    """The `view:feature` references retrieved, in column order (a service's, resolved)."""
    views: dict[str, FeatureViewLineage]
    definitions_sha256: str
    """Hash of the used views' definition hashes, by view name: one value for "the same features"."""
    entity_digest: str
    """Digest of the entity rows the features were joined to (the source's snapshot)."""
    entity_start: str | None = None
    entity_end: str | None = None
    """The entity rows' earliest and latest event time (ISO 8601, UTC): what serving's first
    materialisation must cover."""

    def tags(self) -> dict[str, str]:
        return {
            "trainpipe.feast_project": self.project,
            "trainpipe.feast_features": ",".join(self.features)[:5000],  # MLflow caps a tag value
            "trainpipe.feast_feature_views": ",".join(sorted(self.views)),
            "trainpipe.feast_definitions_sha256": self.definitions_sha256,
            "trainpipe.feast_entity_digest": self.entity_digest,
            "trainpipe.feast_entity_time": f"{self.entity_start} .. {self.entity_end}",
        }


class Manifest(BaseModel):
    """One snapshot; small enough to pass between tasks as XCom."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    partition_uri: str
    format: str
    files: list[SnapshotFile]
    rows: int
    columns: dict[str, str]
    """Column name -> Arrow type name, in file order."""
    digest: str
    window: list[str] = []
    """The partitions of a `data.window` snapshot that exist, oldest first, as its files are
    ordered; empty for a one-partition snapshot (then `partition_uri` is the one)."""
    missing: list[str] = []
    """The window's partitions that did not exist when it was frozen."""
    source: SourceLineage | None = None
    """A `sql` source's query and window, a `delta` source's table, version, filter and window, an
    `iceberg` source's table, snapshot, filter and window; None for files (`partition_uri` holds
    them)."""
    features: FeatureLineage | None = None
    """`data.feature_store`: the Feast features joined to the source's rows to make these files."""

    @property
    def file_uris(self) -> list[str]:
        return [f.uri for f in self.files]

    @property
    def short_digest(self) -> str:
        return self.digest.removeprefix("sha256:")[:12]

    def lineage_tags(self) -> dict[str, str]:
        """The MLflow tags of where the snapshot came from, beyond its digest."""
        return {**self.window_tags(), **self.source_tags(), **(self.features.tags() if self.features else {})}

    def source_tags(self) -> dict[str, str]:
        """A `sql` snapshot's connection, window and query hash (the manifest keeps the query); a
        `delta` snapshot's table, version, window and filter; an `iceberg` snapshot's catalog
        connection and table, snapshot id, window and filter."""
        source = self.source
        if source is None:
            return {}
        window = {"trainpipe.data_window": f"{source.window_start} .. {source.window_end}"}
        if source.kind == "delta":
            return {
                "trainpipe.data_source": f"delta:{source.table}",
                **window,
                "trainpipe.data_table_version": str(source.version),
                "trainpipe.data_filter": str(source.filter)[:5000],  # MLflow caps a tag value
            }
        if source.kind == "iceberg":
            return {
                "trainpipe.data_source": f"iceberg:{source.conn_id}/{source.table}",
                **window,
                "trainpipe.data_snapshot_id": str(source.snapshot_id),
                "trainpipe.data_filter": str(source.filter)[:5000],
            }
        import hashlib

        return {
            "trainpipe.data_source": f"{source.kind}:{source.conn_id}",
            **window,
            "trainpipe.data_query_sha256": hashlib.sha256((source.query or "").encode()).hexdigest(),
        }

    def window_tags(self) -> dict[str, str]:
        """Lineage tags of a window snapshot (none for one partition): what it spans, what it lacked."""
        if not self.window:
            return {}
        missing = ", ".join(self.missing) or "-"
        if len(missing) > 2000:  # MLflow caps a tag value; the manifest keeps the whole list
            missing = f"{len(self.missing)} partitions, {self.missing[0]} .. {self.missing[-1]}"
        return {
            "trainpipe.data_window": f"{self.window[0]} .. {self.window[-1]}",
            "trainpipe.data_partitions": str(len(self.window)),
            "trainpipe.data_missing": missing,
        }
