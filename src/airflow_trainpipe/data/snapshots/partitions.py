"""A `files` source's partitions: where the rendered partition lives under `data.uri`, the data
files in it, whether it is complete, and object versions on S3 (`data.freeze: versions`).

Names starting with `_` or `.` inside a partition are bookkeeping (`_SUCCESS`, `_trainpipe/`,
Spark's `.crc` files) and never data.
"""

from __future__ import annotations

from typing import Any

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.core.storage import filesystem, join, resolve
from airflow_trainpipe.data.snapshots.errors import PartitionError, UnversionedError

STATE_DIR = "_trainpipe"


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


def file_facts(fs: Any, path: str, fmt: str) -> tuple[int, dict[str, str]]:
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


_VERSION_QUERY = "?versionId="


def pinned(fs: Any, uri: str, path: str) -> tuple[str, str]:
    """`uri` and `path` pinned to the object's current S3 version (`?versionId=`, which s3fs reads
    from a path): what the manifest records, so every later read gets these bytes."""
    version = current_version(fs, path)
    if not version or version == "null":  # "null": written while the bucket was unversioned
        raise UnversionedError(
            f"data.freeze is versions, but {uri} has no object version: enable versioning on its "
            "bucket (objects written before that have none; rewrite them), or set data.freeze: true to copy"
        )
    return f"{uri}{_VERSION_QUERY}{version}", f"{path}{_VERSION_QUERY}{version}"


def current_version(fs: Any, path: str) -> str | None:
    # refresh: the listing that found the file cached its entry, and a listing has no versions.
    return fs.info(path, refresh=True).get("VersionId")


def unpinned(uri: str) -> str:
    return uri.split(_VERSION_QUERY, 1)[0]


def version_of(uri: str) -> str | None:
    """The object version a pinned URI reads; None for any other URI."""
    return uri.split(_VERSION_QUERY, 1)[1] if _VERSION_QUERY in uri else None


def partition_ready(
    uri: str, fmt: str, marker: str | None, min_rows: int | None, conn_id: str | None = None
) -> tuple[bool, str]:
    """Whether a partition is complete by the config's rule, and why not (for the sensor's log)."""
    fs, base = filesystem(uri, conn_id)
    if marker is not None and not fs.exists(f"{base.rstrip('/')}/{marker}"):
        return False, f"{join(uri, marker)} does not exist yet"
    if min_rows is not None:
        files = list_data_files(uri, fmt, conn_id)
        rows = sum(file_facts(fs, filesystem(f)[1], fmt)[0] for f in files)
        if rows < min_rows:
            return False, f"{uri} holds {rows} row(s) in {len(files)} file(s), fewer than {min_rows}"
        return True, f"{uri} holds {rows} row(s) in {len(files)} file(s)"
    return True, f"{join(uri, marker or '')} exists"
