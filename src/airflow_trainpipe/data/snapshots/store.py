"""The content-addressed snapshot store: `<snapshots.uri>/sha256/<2 hex>/<sha256>.parquet`.

A file's name is its content's sha256, so a stored file is never changed, an export that gives the
same bytes again shares it, and nothing at the source (an overwritten day, a vacuumed table
version) can change what an old snapshot reads. Writes are atomic: a local file is renamed into
place, an S3 object appears whole; a file of the wrong size under its name (a copy cut short by
hand) is replaced.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING

from airflow_trainpipe.core.storage import filesystem, is_local, join, local_path, resolve, trainpipe_home

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.contracts.manifest import Manifest, SnapshotFile, SourceLineage


def frozen_uri(store: str, sha256: str, suffix: str = ".parquet") -> str:
    return join(resolve(store), "sha256", sha256[:2], f"{sha256}{suffix}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def freeze_file(path: Path, rows: int, store: str, conn_id: str | None = None) -> SnapshotFile:
    """Store a finished local file under its content's name; the snapshot entry that reads it."""
    from airflow_trainpipe.contracts.manifest import SnapshotFile

    sha256, size = _sha256(path), path.stat().st_size
    uri = frozen_uri(store, sha256, "".join(path.suffixes) or ".parquet")
    fs, target = filesystem(uri, conn_id)
    if not (fs.exists(target) and fs.size(target) == size):
        if is_local(uri):
            final = local_path(uri)
            final.parent.mkdir(parents=True, exist_ok=True)
            partial = final.with_name(f".{final.name}.{uuid.uuid4().hex}.partial")
            shutil.copyfile(path, partial)
            partial.replace(final)
        else:
            fs.put_file(str(path), target)
    return SnapshotFile(uri=uri, size=size, sha256=sha256, rows=rows)


def freeze_manifest(config: PipelineConfig, manifest: Manifest, conn_id: str | None = None) -> Manifest:
    """A `files` snapshot with its files copied into the store: the same digest, the store's URIs.

    Each file is hashed as it is copied; one whose bytes are no longer the manifest's (the
    partition was rewritten after validation) fails the run rather than freezing other data.
    """
    frozen = [_copy_into_store(f, config.snapshots.uri, conn_id) for f in manifest.files]
    result = manifest.model_copy(update={"files": frozen})
    record_use(config, result, conn_id)
    return result


def copy_hashed(uri: str, out: IO[bytes], conn_id: str | None = None) -> str:
    """Copy the file at `uri` into `out`; the sha256 of the bytes copied (one read for both)."""
    fs, path = filesystem(uri, conn_id)
    digest = hashlib.sha256()
    with fs.open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _copy_into_store(entry: SnapshotFile, store: str, conn_id: str | None) -> SnapshotFile:
    from airflow_trainpipe.data.snapshots.errors import SnapshotError

    suffix = "." + entry.uri.rsplit(".", 1)[-1] if "." in entry.uri.rsplit("/", 1)[-1] else ""
    uri = frozen_uri(store, entry.sha256, suffix)
    fs, target = filesystem(uri, conn_id)
    if fs.exists(target) and fs.size(target) == entry.size:
        return entry.model_copy(update={"uri": uri})
    scratch = trainpipe_home() / "exports"
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=scratch, suffix=suffix) as staged:
        sha256 = copy_hashed(entry.uri, staged, conn_id)
        staged.flush()
        if sha256 != entry.sha256:
            raise SnapshotError(
                f"{entry.uri} changed after it was validated (sha256 {sha256[:12]}..., "
                f"validated {entry.sha256[:12]}...); nothing is frozen or trained from it"
            )
        return freeze_file(Path(staged.name), entry.rows, store, conn_id)


def use_uri(store: str, pipeline: str, digest: str) -> str:
    return join(resolve(store), "uses", pipeline, f"{digest.removeprefix('sha256:')}.json")


def record_use(config: PipelineConfig, manifest: Manifest, conn_id: str | None = None) -> None:
    """Record in the store itself which pipeline froze the snapshot, and when (rewritten on every
    use): `snapshots gc` reads these, so it sees every pipeline that shares the store, not only
    the configs it was given, and asks each one's registry before deleting anything."""
    import json

    uri = use_uri(config.snapshots.uri, config.pipeline, manifest.digest)
    fs, path = filesystem(uri, conn_id)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    document = {
        "pipeline": config.pipeline,
        "registered_model": config.registered_model_name,
        "manifest": manifest.model_dump(mode="json"),
    }
    fs.pipe_file(path, json.dumps(document, indent=1).encode())


@contextmanager
def scratch_folder(config: PipelineConfig) -> Iterator[Path]:
    """A local folder for one export (its files, a sort's spilled runs), removed afterwards."""
    scratch = trainpipe_home() / "exports"
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch, prefix=f"{config.pipeline}-") as folder:
        yield Path(folder)


def store_export(
    config: PipelineConfig,
    partition: str,
    files: list[SnapshotFile],
    schema: pa.Schema,
    lineage: SourceLineage,
    conn_id: str | None,
) -> Manifest:
    from airflow_trainpipe.contracts.manifest import Manifest
    from airflow_trainpipe.core.digest import combine
    from airflow_trainpipe.data.snapshots.manifests import store_manifest
    from airflow_trainpipe.data.snapshots.partitions import partition_uri

    manifest = Manifest(
        partition_uri=partition_uri(config.data, partition),
        format="parquet",
        files=files,
        rows=sum(f.rows for f in files),
        columns={field.name: str(field.type) for field in schema},
        digest=combine([f.sha256 for f in files]),
        source=lineage,
    )
    store_manifest(config.data, manifest, conn_id)
    record_use(config, manifest, conn_id)
    return manifest
