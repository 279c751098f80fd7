"""Content digest of a data snapshot: the data version recorded for lineage.

sha256 over each file's content digest in the snapshot's order, so the same bytes always give
the same digest and any changed, added, removed or reordered file changes it. File names and
modification times do not enter it: a copy of the same data has the same version.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from airflow_trainpipe.core.storage import filesystem

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


def combine(file_digests: list[str]) -> str:
    """The snapshot digest of files whose sha256 hex digests are given, in order."""
    combined = hashlib.sha256()
    for hexdigest in file_digests:
        combined.update(hexdigest.encode() + b"\n")
    return f"sha256:{combined.hexdigest()}"


def content_digest(uris: list[str]) -> str:
    return combine([file_sha256(uri) for uri in uris])
