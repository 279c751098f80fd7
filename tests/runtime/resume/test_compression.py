"""The checkpoint codec: bit-exact round trips, and damage that cannot pass for a checkpoint file."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import zstandard

from airflow_trainpipe.runtime.resume.compression import CHUNK, compress_file, decompress_file

# Several chunks of incompressible bytes around a run of zeros: both kinds of content, and a
# stream that needs more than one read and one write on each side.
CONTENT = os.urandom(3 * CHUNK + 17) + bytes(2 * CHUNK) + os.urandom(1000)


@pytest.fixture
def compressed(tmp_path: Path) -> Path:
    original = tmp_path / "shard.pt"
    original.write_bytes(CONTENT)
    compress_file(original, tmp_path / "shard.pt.zst")
    return tmp_path / "shard.pt.zst"


def test_round_trip_is_bit_exact_and_reports_the_stored_bytes(tmp_path: Path) -> None:
    original = tmp_path / "shard.pt"
    original.write_bytes(CONTENT)
    stored = tmp_path / "shard.pt.zst"
    size, digest = compress_file(original, stored)
    assert (size, digest) == (stored.stat().st_size, hashlib.sha256(stored.read_bytes()).hexdigest())
    assert size < len(CONTENT)  # the zeros compress
    with stored.open("rb") as source:
        decompress_file(source, tmp_path / "out.pt", len(CONTENT))
    assert (tmp_path / "out.pt").read_bytes() == CONTENT


def test_an_empty_file_round_trips(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    compress_file(tmp_path / "empty", tmp_path / "empty.zst")
    with (tmp_path / "empty.zst").open("rb") as source:
        decompress_file(source, tmp_path / "out", 0)
    assert (tmp_path / "out").read_bytes() == b""


def test_a_truncated_frame_fails_instead_of_giving_a_short_file(compressed: Path, tmp_path: Path) -> None:
    compressed.write_bytes(compressed.read_bytes()[:-100])
    with pytest.raises(ValueError, match="expected"), compressed.open("rb") as source:
        decompress_file(source, tmp_path / "out.pt", len(CONTENT))


def test_a_flipped_byte_fails_the_frames_checksum(compressed: Path, tmp_path: Path) -> None:
    data = bytearray(compressed.read_bytes())
    data[len(data) // 2] ^= 0xFF
    compressed.write_bytes(bytes(data))
    with pytest.raises(zstandard.ZstdError), compressed.open("rb") as source:
        decompress_file(source, tmp_path / "out.pt", len(CONTENT))


def test_a_size_other_than_the_markers_fails(compressed: Path, tmp_path: Path) -> None:
    expected = f"decompressed to {len(CONTENT)} bytes, expected 5"
    with pytest.raises(ValueError, match=expected), compressed.open("rb") as source:
        decompress_file(source, tmp_path / "out.pt", 5)
