"""Lossless compression of checkpoint files (`training.checkpoint.compression: zstd`).

One zstd frame per file, streamed in chunks (a shard can be larger than the memory to spare).
Each frame records its content size and a checksum of the content, so a decompression that does
not give back the original bytes fails here, not later inside DeepSpeed's torch.load; the stored
bytes themselves are checked first, against the sha256 in the checkpoint's marker.

zstandard is imported where it is used: only a job with `compression: zstd` loads it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import IO, Any, cast

SUFFIX = ".zst"
# Level 1: fp32 weights and Adam moments are mostly float mantissas, which no level compresses.
# On a 100M-parameter checkpoint level 1 stores 0.895 of the bytes, level 3 0.890 and level 9
# 0.892, and level 1 compresses 2 to 4 times as fast as level 3 (404 vs 95 MiB/s in BENCHMARKS.md,
# "Checkpoint compression"; 2x in a rerun on the same busy machine). A local save waits for it.
LEVEL = 1
# zstd's own worker threads, capped: the caller is one rank per node, and on a large node the
# other ranks are training (with a remote store the save runs beside the training loop).
MAX_THREADS = 4
CHUNK = 1 << 20


class _HashingWriter:
    """The compressed bytes go to the file and through sha256 at once: no second read to hash."""

    def __init__(self, raw: IO[bytes]):
        self.raw, self.sha256, self.size = raw, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return self.raw.write(data)


def _threads() -> int:
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        available = os.cpu_count() or 1
    return min(MAX_THREADS, available)


def compress_file(
    source: Path, target: Path, level: int = LEVEL, threads: int | None = None
) -> tuple[int, str]:
    """Write `source` zstd-compressed to `target`; return the stored (size, sha256)."""
    import zstandard

    threads = _threads() if threads is None else threads
    compressor = zstandard.ZstdCompressor(level=level, threads=threads, write_checksum=True)
    with source.open("rb") as src, target.open("wb") as raw:
        out = _HashingWriter(raw)
        compressor.copy_stream(
            src, cast(IO[bytes], out), size=source.stat().st_size, read_size=CHUNK, write_size=CHUNK
        )
    return out.size, out.sha256.hexdigest()


def decompress_file(source: IO[bytes], target: Path, expected_size: int) -> None:
    """Write the decompressed bytes of the open `source` to `target`.

    Raises ValueError when the result is not `expected_size` bytes: a streamed frame cut short
    decompresses without an error (the frame's checksum is only checked at its end).
    """
    import zstandard

    with target.open("wb") as out:
        _, written = zstandard.ZstdDecompressor().copy_stream(source, out, read_size=CHUNK, write_size=CHUNK)
    if written != expected_size:
        raise ValueError(f"decompressed to {written} bytes, expected {expected_size}")
