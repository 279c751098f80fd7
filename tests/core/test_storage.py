"""storage: TRAINPIPE_HOME, resolving and joining storage URIs, local paths and filesystems."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from airflow_trainpipe.core.storage import (
    HOME_ENV,
    filesystem,
    is_local,
    join,
    local_path,
    node_local_dir,
    resolve,
    trainpipe_home,
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    return tmp_path / "home"


def test_home_is_the_environment_variable_resolved(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(home.parent)
    monkeypatch.setenv(HOME_ENV, "home/../home")
    assert trainpipe_home() == home


@pytest.mark.parametrize("value", [None, ""])
def test_without_a_home_relative_paths_land_in_var_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(HOME_ENV, raising=False)
    else:
        monkeypatch.setenv(HOME_ENV, value)
    monkeypatch.chdir(tmp_path)
    assert trainpipe_home() == tmp_path.resolve() / "var"


def test_a_relative_path_resolves_under_home(home: Path) -> None:
    assert resolve("data/tx") == f"file://{home}/data/tx"


@pytest.mark.parametrize(
    ("uri", "resolved"),
    [("s3://bucket/prefix/", "s3://bucket/prefix"), ("file:///data/x//", "file:///data/x")],
)
def test_a_uri_with_a_scheme_only_loses_trailing_slashes(home: Path, uri: str, resolved: str) -> None:
    assert resolve(uri) == resolved


@pytest.mark.parametrize(
    ("parts", "joined"),
    [
        (("s3://b/root/", "/run/", "step-1/"), "s3://b/root/run/step-1"),
        (("file:///r", "", "x"), "file:///r/x"),
        (("file:///r",), "file:///r"),
        (("rel", "a/b"), "rel/a/b"),
    ],
)
def test_join_puts_exactly_one_slash_between_parts(parts: tuple[str, ...], joined: str) -> None:
    assert join(*parts) == joined


@pytest.mark.parametrize(
    ("uri", "local"), [("file:///x", True), ("data/x", True), ("s3://b/x", False), ("gs://b", False)]
)
def test_local_uris_are_files_and_relative_paths(uri: str, local: bool) -> None:
    assert is_local(uri) is local


@pytest.mark.parametrize(
    ("uri", "path"), [("file:///data/x", "/data/x"), ("data/x", "data/x"), ("file:/data/y", "/data/y")]
)
def test_the_local_path_of_a_local_uri(uri: str, path: str) -> None:
    assert local_path(uri) == Path(path)


def test_a_remote_uri_has_no_local_path() -> None:
    with pytest.raises(ValueError, match=r"^s3://b/x is not a local file:// URI$"):
        local_path("s3://b/x")


def test_a_local_uri_is_its_own_node_local_dir(home: Path) -> None:
    assert node_local_dir("file:///data/ckpt", "staging") == Path("/data/ckpt")


def test_a_remote_uri_gets_a_stable_spot_under_home_per_purpose(home: Path) -> None:
    uri = "s3://bucket/ckpt/fraud/run1"
    expected = home / "staging" / hashlib.sha1(uri.encode()).hexdigest()[:16]
    assert node_local_dir(uri, "staging") == expected
    assert node_local_dir(uri, "progress").parent == home / "progress"
    assert node_local_dir(uri + "2", "staging") != expected


def test_a_file_uri_opens_on_the_local_filesystem(tmp_path: Path) -> None:
    (tmp_path / "part-0.parquet").write_bytes(b"PAR1")
    fs, path = filesystem((tmp_path / "part-0.parquet").as_uri())
    assert isinstance(fs, LocalFileSystem) and path == str(tmp_path / "part-0.parquet")
    assert fs.cat_file(path) == b"PAR1"


def test_an_s3_uri_opens_the_bucket_with_credentials_from_the_environment(s3_endpoint: str) -> None:
    fs, path = filesystem("s3://trainpipe/storage-test/ds=2026-01-01/part-0.csv")
    assert path == "trainpipe/storage-test/ds=2026-01-01/part-0.csv"
    fs.pipe_file(path, b"a,b\n1,2\n")
    assert fs.cat_file(path) == b"a,b\n1,2\n"
    assert fs.ls("trainpipe/storage-test/ds=2026-01-01", detail=False) == [path]


@pytest.mark.parametrize("folder", ["with space", "naïve", "100%"])
def test_a_home_with_characters_a_uri_escapes_still_resolves_to_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: str
) -> None:
    home = tmp_path / folder
    (home / "data").mkdir(parents=True)
    (home / "data" / "part-0.csv").write_text("x\n1\n")
    monkeypatch.setenv(HOME_ENV, str(home))
    uri = resolve("data")
    fs, path = filesystem(uri)
    assert fs.exists(join(path, "part-0.csv")), (uri, path)
    assert local_path(uri) == home / "data"
