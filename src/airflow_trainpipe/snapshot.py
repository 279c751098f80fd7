"""Snapshots: the exact files of one run's partition, frozen into a manifest with a content digest.

A manifest lists every data file with its size, sha256 and row count, the snapshot's schema and
row total, and the digest over the files' contents (`digest.combine`). The digest is the data
version: it is tagged on the MLflow run and the registered model, and training reads exactly the
manifest's files, so a model can be traced to, and retrained on, the bytes it saw.

Manifests are stored content-addressed at `<data.uri>/_trainpipe/snapshots/<hex>.json`: written
once, never changed. Names starting with `_` or `.` inside a partition are bookkeeping
(`_SUCCESS`, `_trainpipe/`, Spark's `.crc` files) and never data.
"""

from __future__ import annotations

import json
from datetime import UTC
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.digest import combine, sha256_of
from airflow_trainpipe.exceptions import TrainpipeError
from airflow_trainpipe.storage import filesystem, join, resolve

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig

STATE_DIR = "_trainpipe"


class SnapshotError(TrainpipeError):
    """The partition is missing, holds no data files, or its files disagree with each other."""

    retryable = True  # files may still arrive, a store may recover


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


class PartitionError(TrainpipeError):
    """A rendered partition that is not a plain sub-path of `data.uri`: retrying cannot fix it."""


def partition_uri(data: DataSection, partition: str) -> str:
    """`<data.uri>/<partition>`, once the rendered partition is known to stay under `data.uri`.

    The config checks the template; this checks what it rendered to, which a trigger form or a
    DAG run's conf can set to anything: the snapshot is read, and reports written, there.
    """
    root = resolve(data.uri)
    problem = _partition_problem(partition)
    if problem:
        raise PartitionError(
            f"partition {partition!r} (under data.uri {root}) {problem}; expected a relative sub-path "
            "such as ds=2026-01-01"
        )
    return join(root, partition.rstrip("/"))


def _partition_problem(partition: str) -> str | None:
    if not partition.strip():
        return "is empty"
    if partition.startswith("/") or "://" in partition or (len(partition) > 1 and partition[1] == ":"):
        return "is absolute"
    if any(ord(c) < 32 or c in "\\\x7f" for c in partition):
        return "contains a backslash or a control character"
    segments = partition.rstrip("/").split("/")
    if "" in segments:
        return "has an empty segment ('//')"
    if odd := [s for s in segments if s in (".", "..")]:
        return f"has a {odd[0]!r} segment and would not stay under data.uri"
    if STATE_DIR in segments:
        return f"names the bookkeeping folder {STATE_DIR}"
    return None


def _is_data(relative: str, suffix: str) -> bool:
    return relative.endswith(suffix) and not any(part.startswith(("_", ".")) for part in relative.split("/"))


def list_data_files(uri: str, fmt: str, conn_id: str | None = None) -> list[str]:
    """Data files under a partition URI, sorted: the snapshot's order (it enters the digest)."""
    fs, base = filesystem(uri, conn_id)
    suffix = ".parquet" if fmt == "parquet" else ".csv"
    try:
        found = fs.find(base)
    except FileNotFoundError:
        found = []
    base = base.rstrip("/")
    names = sorted(p for p in found if _is_data(p[len(base) + 1 :], suffix))
    scheme = uri.split("://", 1)[0]
    return [f"{scheme}://{name}" if scheme != "file" else f"file://{name}" for name in names]


def _file_facts(fs: Any, path: str, fmt: str) -> tuple[int, dict[str, str]]:
    """Rows and schema of one file: the Parquet footer only; a CSV is streamed once."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with fs.open(path, "rb") as handle:
            meta = pq.ParquetFile(handle).metadata
            schema = meta.schema.to_arrow_schema()
            return meta.num_rows, {f.name: str(f.type) for f in schema}
    import pyarrow.csv as pcsv

    with fs.open(path, "rb") as handle:
        reader = pcsv.open_csv(handle)
        rows = sum(batch.num_rows for batch in reader)
        return rows, {f.name: str(f.type) for f in reader.schema}


def resolve_snapshot(data: DataSection, partition: str, conn_id: str | None = None) -> Manifest:
    """Freeze the partition into a manifest and store it (idempotent: same bytes, same manifest)."""
    uri = partition_uri(data, partition)
    files = list_data_files(uri, data.format, conn_id)
    if not files:
        raise SnapshotError(f"no *.{data.format} files under {uri}")
    fs, _ = filesystem(uri, conn_id)
    entries: list[SnapshotFile] = []
    columns: dict[str, str] | None = None
    for listed in files:
        file_uri, path = listed, filesystem(listed)[1]
        if data.freeze == "versions":
            # Pinned before it is read: the hash, the rows and the schema are then the pinned
            # version's, even when the object is overwritten while it is being hashed.
            file_uri, path = pinned(fs, listed, path)
        rows, schema = _file_facts(fs, path, data.format)
        if columns is None:
            columns = schema
        elif schema != columns:
            raise SnapshotError(
                f"{file_uri} does not have the schema of {files[0]} (differing columns: "
                f"{_differing(schema, columns)}); a snapshot's files must agree"
            )
        entries.append(SnapshotFile(uri=file_uri, size=fs.size(path), sha256=sha256_of(fs, path), rows=rows))
    manifest = Manifest(
        partition_uri=uri,
        format=data.format,
        files=entries,
        rows=sum(e.rows for e in entries),
        columns=columns or {},
        digest=combine([e.sha256 for e in entries]),
    )
    store_manifest(data, manifest, conn_id)
    return manifest


def _differing(columns: dict[str, str], other: dict[str, str]) -> str:
    return ", ".join(f"{n}: {t}" for n, t in sorted(set(columns.items()) ^ set(other.items())))


def window_snapshot(
    data: DataSection, parts: list[tuple[str, Manifest]], missing: list[str], conn_id: str | None = None
) -> Manifest:
    """One snapshot over a window's partitions, given oldest first with their manifests: the files
    in that order under one digest, so the window is one data version like a single partition."""
    (_, newest), files = parts[-1], [f for _, manifest in parts for f in manifest.files]
    for partition, manifest in parts:
        if manifest.columns != newest.columns or manifest.format != newest.format:
            raise SnapshotError(
                f"partition {partition} of the window does not have the schema of the newest, "
                f"{parts[-1][0]} (differing columns: {_differing(manifest.columns, newest.columns)}); "
                "a window's partitions must agree"
            )
    window = Manifest(
        partition_uri=newest.partition_uri,
        format=newest.format,
        files=files,
        rows=sum(f.rows for f in files),
        columns=newest.columns,
        digest=combine([f.sha256 for f in files]),
        window=[partition for partition, _ in parts],
        missing=missing,
    )
    store_manifest(data, window, conn_id)
    return window


def missing_partitions(data: DataSection, partitions: list[str], conn_id: str | None = None) -> list[str]:
    """The window's partitions that hold no data files (a listing each, no reads), after checking
    that enough exist: fewer than `data.window.min_partitions` fails naming every missing one.
    The newest is left to `resolve_snapshot` (it is the one the run waited for)."""
    from airflow_trainpipe.window import WindowError

    missing = [
        p for p in partitions[:-1] if not list_data_files(partition_uri(data, p), data.format, conn_id)
    ]
    required = data.window.required if data.window is not None else 1
    if len(partitions) - len(missing) < required:
        raise WindowError(
            f"the window of {len(partitions)} partitions ending at {partitions[-1]} under "
            f"{resolve(data.uri)} has {len(partitions) - len(missing)}, fewer than "
            f"data.window.min_partitions ({required}); missing: {', '.join(missing)}"
        )
    return missing


def resolve_window(data: DataSection, partitions: list[str], conn_id: str | None = None) -> Manifest:
    """Freeze a window's partitions into one snapshot as they are now, unvalidated (the train
    task without a validate task, the CLI); one partition is its own snapshot."""
    if len(partitions) == 1:
        return resolve_snapshot(data, partitions[0], conn_id)
    missing = missing_partitions(data, partitions, conn_id)
    parts = [(p, resolve_snapshot(data, p, conn_id)) for p in partitions if p not in missing]
    return window_snapshot(data, parts, missing, conn_id)


def is_current(manifest: Manifest, conn_id: str | None = None) -> bool:
    """Whether a partition still holds exactly the manifest's files at their sizes (pinned files:
    as their current versions): a listing and a stat per file, not a re-hash (training re-hashes
    every byte it reads anyway)."""
    listed = list_data_files(manifest.partition_uri, manifest.format, conn_id)
    if listed != [unpinned(f.uri) for f in manifest.files]:
        return False
    fs, _ = filesystem(manifest.partition_uri, conn_id)
    for entry in manifest.files:
        path, version = filesystem(unpinned(entry.uri))[1], version_of(entry.uri)
        if version is None:
            if fs.size(path) != entry.size:
                return False
        elif _current_version(fs, path) != version:
            return False
    return True


_VERSION_QUERY = "?versionId="


class UnversionedError(SnapshotError):
    """`data.freeze: versions` on an object that has no version: retrying cannot version it."""

    retryable = False


def pinned(fs: Any, uri: str, path: str) -> tuple[str, str]:
    """`uri` and `path` pinned to the object's current S3 version (`?versionId=`, which s3fs reads
    from a path): what the manifest records, so every later read gets these bytes."""
    version = _current_version(fs, path)
    if not version or version == "null":  # "null": written while the bucket was unversioned
        raise UnversionedError(
            f"data.freeze is versions, but {uri} has no object version: enable versioning on its "
            "bucket (objects written before that have none; rewrite them), or set data.freeze: true to copy"
        )
    return f"{uri}{_VERSION_QUERY}{version}", f"{path}{_VERSION_QUERY}{version}"


def _current_version(fs: Any, path: str) -> str | None:
    # refresh: the listing that found the file cached its entry, and a listing has no versions.
    return fs.info(path, refresh=True).get("VersionId")


def unpinned(uri: str) -> str:
    return uri.split(_VERSION_QUERY, 1)[0]


def version_of(uri: str) -> str | None:
    """The object version a pinned URI reads; None for any other URI."""
    return uri.split(_VERSION_QUERY, 1)[1] if _VERSION_QUERY in uri else None


def manifest_uri(data: DataSection, digest: str) -> str:
    return join(resolve(data.uri), STATE_DIR, "snapshots", f"{digest.removeprefix('sha256:')}.json")


def store_manifest(data: DataSection, manifest: Manifest, conn_id: str | None = None) -> str:
    uri = manifest_uri(data, manifest.digest)
    fs, path = filesystem(uri, conn_id)
    if not fs.exists(path):  # content-addressed: an existing one has the same content
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, manifest.model_dump_json(indent=1).encode())
    return uri


def load_manifest(data: DataSection, digest: str, conn_id: str | None = None) -> Manifest:
    """The stored manifest of a digest: how a past training run is reproduced."""
    uri = manifest_uri(data, digest)
    fs, path = filesystem(uri, conn_id)
    try:
        manifest = Manifest.model_validate(json.loads(fs.cat_file(path)))
    except FileNotFoundError:
        raise SnapshotError(
            f"no snapshot with digest {digest} under {resolve(data.uri)} ({uri} is missing)"
        ) from None
    # The digest is what validation recorded; the stored manifest must hash to it, or it was
    # altered since (the store is shared): its file list and sha256s would not be the validated ones.
    if manifest.digest != digest or combine([f.sha256 for f in manifest.files]) != digest:
        raise SnapshotError(
            f"manifest {uri} does not hash to its digest {digest}: it was altered after validation"
        )
    return manifest


def partition_ready(
    uri: str, fmt: str, marker: str | None, min_rows: int | None, conn_id: str | None = None
) -> tuple[bool, str]:
    """Whether a partition is complete by the config's rule, and why not (for the sensor's log)."""
    fs, base = filesystem(uri, conn_id)
    if marker is not None and not fs.exists(f"{base.rstrip('/')}/{marker}"):
        return False, f"{join(uri, marker)} does not exist yet"
    if min_rows is not None:
        files = list_data_files(uri, fmt, conn_id)
        rows = sum(_file_facts(fs, filesystem(f)[1], fmt)[0] for f in files)
        if rows < min_rows:
            return False, f"{uri} holds {rows} row(s) in {len(files)} file(s), fewer than {min_rows}"
        return True, f"{uri} holds {rows} row(s) in {len(files)} file(s)"
    return True, f"{join(uri, marker or '')} exists"


def render_partition(template: str, ds: str) -> str:
    """Render `data.partition` outside Airflow (the CLI), with the Airflow names it commonly uses."""
    return _render(template, _date_names(ds))


def cli_snapshot(config: PipelineConfig, ds: str) -> Manifest:
    """The snapshot a CLI run on `ds` reads (unvalidated), as the DAG's run of that date would."""
    from airflow_trainpipe.sources import freeze_run

    names = _date_names(ds)
    return freeze_run(config, names, _render(config.data.partition, names), _render)


def cli_window(data: DataSection, ds: str) -> list[str]:
    """The partitions a CLI run on `ds` reads, oldest first, as the DAG's run of that date would."""
    from airflow_trainpipe.window import run_window

    names = _date_names(ds)
    return run_window(data, names, _render(data.partition, names), _render)


def _date_names(ds: str) -> dict[str, Any]:
    from datetime import datetime

    from airflow_trainpipe.window import date_context

    return date_context(datetime.fromisoformat(ds).replace(tzinfo=UTC))


def _render(template: str, context: Any) -> str:
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update({"ds": lambda d: d.strftime("%Y-%m-%d"), "ds_nodash": lambda d: d.strftime("%Y%m%d")})
    try:
        return env.from_string(template).render(**context)
    except jinja2.UndefinedError as exc:
        raise SnapshotError(f"cannot render partition {template!r} outside Airflow: {exc}") from exc
