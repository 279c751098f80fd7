"""digest: streamed sha256 of one file and the order-sensitive digest of a snapshot's files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from airflow_trainpipe.core.digest import combine, content_digest, file_sha256, sha256_of


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """Three small files by name: their file:// URIs."""
    uris = {}
    for name, content in (("a", b"alpha\n"), ("b", b"beta\n"), ("copy_of_a", b"alpha\n")):
        path = tmp_path / f"{name}.bin"
        path.write_bytes(content)
        uris[name] = path.as_uri()
    return uris


def test_a_file_larger_than_one_chunk_hashes_like_its_whole_content(tmp_path: Path) -> None:
    content = bytes(range(256)) * 4097 + b"tail"  # just over 1 MiB: a second, partial chunk
    path = tmp_path / "big.bin"
    path.write_bytes(content)
    assert sha256_of(LocalFileSystem(), str(path)) == hashlib.sha256(content).hexdigest()


def test_an_empty_file_has_the_digest_of_no_bytes(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256((tmp_path / "empty").as_uri()) == hashlib.sha256(b"").hexdigest()


def test_a_file_uri_is_hashed_through_its_filesystem(files: dict[str, str]) -> None:
    assert file_sha256(files["a"]) == hashlib.sha256(b"alpha\n").hexdigest()


def test_combine_hashes_each_hex_digest_on_its_own_line() -> None:
    expected = hashlib.sha256(b"ab\ncd\n").hexdigest()
    assert combine(["ab", "cd"]) == f"sha256:{expected}"


def test_combining_nothing_is_the_digest_of_no_bytes() -> None:
    assert combine([]) == "sha256:" + hashlib.sha256(b"").hexdigest()


def test_the_order_of_files_matters() -> None:
    assert combine(["ab", "cd"]) != combine(["cd", "ab"])


def test_digest_boundaries_cannot_be_shifted() -> None:
    assert combine(["abc", "d"]) != combine(["ab", "cd"])


def test_names_do_not_enter_the_content_digest(files: dict[str, str]) -> None:
    assert content_digest([files["a"], files["b"]]) == content_digest([files["copy_of_a"], files["b"]])


def test_any_added_removed_or_reordered_file_changes_the_content_digest(files: dict[str, str]) -> None:
    base = content_digest([files["a"], files["b"]])
    variants = [[files["a"]], [files["b"], files["a"]], [files["a"], files["b"], files["copy_of_a"]]]
    digests = {content_digest(uris) for uris in variants}
    assert base not in digests and len(digests) == 3


def test_the_content_digest_combines_the_file_digests(files: dict[str, str]) -> None:
    hexes = [hashlib.sha256(b"beta\n").hexdigest(), hashlib.sha256(b"alpha\n").hexdigest()]
    assert content_digest([files["b"], files["a"]]) == combine(hexes)


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        file_sha256((tmp_path / "missing.parquet").as_uri())
