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

from airflow_trainpipe.contracts.tags import (
    DATA_MISSING_TAG,
    DATA_PARTITIONS_TAG,
    DATA_WINDOW_TAG,
    FEAST_DEFINITIONS_SHA256_TAG,
    FEAST_ENTITY_DIGEST_TAG,
    FEAST_ENTITY_TIME_TAG,
    FEAST_FEATURE_VIEWS_TAG,
    FEAST_FEATURES_TAG,
    FEAST_PROJECT_TAG,
)


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
    with it None (every field after `kind` but the window is optional). What the fields mean as
    tags and in logs is the kind's to say (`data.sources.<kind>.KIND.lineage_tags`, `origin`)."""

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
            FEAST_PROJECT_TAG: self.project,
            FEAST_FEATURES_TAG: ",".join(self.features)[:5000],  # MLflow caps a tag value
            FEAST_FEATURE_VIEWS_TAG: ",".join(sorted(self.views)),
            FEAST_DEFINITIONS_SHA256_TAG: self.definitions_sha256,
            FEAST_ENTITY_DIGEST_TAG: self.entity_digest,
            FEAST_ENTITY_TIME_TAG: f"{self.entity_start} .. {self.entity_end}",
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

    def window_tags(self) -> dict[str, str]:
        """Lineage tags of a window snapshot (none for one partition): what it spans, what it lacked."""
        if not self.window:
            return {}
        missing = ", ".join(self.missing) or "-"
        if len(missing) > 2000:  # MLflow caps a tag value; the manifest keeps the whole list
            missing = f"{len(self.missing)} partitions, {self.missing[0]} .. {self.missing[-1]}"
        return {
            DATA_WINDOW_TAG: f"{self.window[0]} .. {self.window[-1]}",
            DATA_PARTITIONS_TAG: str(len(self.window)),
            DATA_MISSING_TAG: missing,
        }
