"""Content digest of a data snapshot: the data version recorded for lineage.

sha256 over each file's content digest in the snapshot's order, so the same bytes always give
the same digest and any changed, added, removed or reordered file changes it. File names and
modification times do not enter it: a copy of the same data has the same version.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from airflow_trainpipe.storage import filesystem

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem


def sha256_of(fs: AbstractFileSystem, path: str) -> str:
    """Streamed in 1 MiB chunks: checkpoint shards and data files may be larger than memory."""
    digest = hashlib.sha256()
    with fs.open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(uri: str) -> str:
    return sha256_of(*filesystem(uri))


def content_digest(uris: list[str]) -> str:
    combined = hashlib.sha256()
    for uri in uris:
        combined.update(file_sha256(uri).encode() + b"\n")
    return f"sha256:{combined.hexdigest()}"
