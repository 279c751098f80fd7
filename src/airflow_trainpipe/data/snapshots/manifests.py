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
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.contracts.manifest import Manifest, SnapshotFile
from airflow_trainpipe.core.digest import combine, sha256_of
from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.core.storage import filesystem, join, resolve

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig

STATE_DIR = "_trainpipe"


class SnapshotError(TrainpipeError):
    """The partition is missing, holds no data files, or its files disagree with each other."""

    retryable = True  # files may still arrive, a store may recover


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
    from airflow_trainpipe.data.window import WindowError

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


def cli_snapshot(config: PipelineConfig, ds: str) -> Manifest:
    """The snapshot a CLI run on `ds` reads (unvalidated), as the DAG's run of that date would."""
    from airflow_trainpipe.config.templates import date_names, render
    from airflow_trainpipe.data.sources import freeze_run

    names = date_names(ds)
    return freeze_run(config, names, render(config.data.partition, names), render)


def cli_window(data: DataSection, ds: str) -> list[str]:
    """The partitions a CLI run on `ds` reads, oldest first, as the DAG's run of that date would."""
    from airflow_trainpipe.config.templates import date_names, render
    from airflow_trainpipe.data.window import run_window

    names = date_names(ds)
    return run_window(data, names, render(data.partition, names), render)
