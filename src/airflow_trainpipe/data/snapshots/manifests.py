"""Manifests of snapshots: a partition's files (or a window's partitions) hashed into a manifest,
and manifests stored and loaded by digest.

What a manifest holds is the contract in `contracts.manifest`; this module builds and stores
them. Manifests are stored content-addressed at `<data.uri>/_trainpipe/snapshots/<hex>.json`:
written once, never changed, and checked against their digest when loaded.
"""

from __future__ import annotations

import json

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.contracts.manifest import Manifest, SnapshotFile
from airflow_trainpipe.core.digest import combine, sha256_of
from airflow_trainpipe.core.storage import filesystem, join, resolve
from airflow_trainpipe.data.snapshots.errors import SnapshotError
from airflow_trainpipe.data.snapshots.partitions import (
    STATE_DIR,
    current_version,
    file_facts,
    list_data_files,
    partition_uri,
    pinned,
    unpinned,
    version_of,
)


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
        rows, schema = file_facts(fs, path, data.format)
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
        elif current_version(fs, path) != version:
            return False
    return True


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
