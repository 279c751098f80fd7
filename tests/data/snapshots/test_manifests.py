"""Snapshot manifests: the same bytes always give the same digest; any changed byte changes it."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.core.digest import content_digest
from airflow_trainpipe.data.snapshots.errors import PartitionError, SnapshotError
from airflow_trainpipe.data.snapshots.manifests import (
    is_current,
    load_manifest,
    missing_partitions,
    resolve_snapshot,
    resolve_window,
)
from airflow_trainpipe.data.snapshots.partitions import partition_ready, partition_uri
from airflow_trainpipe.data.window import WindowError, partitions_for_date
from airflow_trainpipe.examples.synthetic import Problem, write_day

DAY = date(2026, 1, 2)
PARTITION = "ds=2026-01-02"


def _data(root: Path, fmt: str = "parquet") -> DataSection:
    return DataSection.model_validate(
        {"uri": root.as_uri(), "format": fmt, "label": "is_fraud", "features": {"numeric": ["amount"]}}
    )


def test_same_bytes_same_digest_wherever_they_live(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_day((tmp_path / name).as_uri(), DAY, 800, seed=4, files=3)
    a, b = (
        resolve_snapshot(_data(tmp_path / "a"), PARTITION),
        resolve_snapshot(_data(tmp_path / "b"), PARTITION),
    )
    assert a.digest == b.digest == content_digest(a.file_uris)
    assert (a.rows, len(a.files)) == (800, 3)
    assert a.columns["amount"] == "double" and a.columns["transaction_id"] == "string"
    assert resolve_snapshot(_data(tmp_path / "a"), PARTITION) == a  # resolving again changes nothing
    assert load_manifest(_data(tmp_path / "a"), a.digest) == a


def test_one_changed_byte_changes_the_digest(tmp_path: Path) -> None:
    files = write_day(tmp_path.as_uri(), DAY, 800, seed=4)
    before = resolve_snapshot(_data(tmp_path), PARTITION)
    path = Path(files[0].removeprefix("file://"))
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 3] ^= 0x01  # inside a data page: the footer still reads
    path.write_bytes(bytes(raw))
    after = resolve_snapshot(_data(tmp_path), PARTITION)
    assert after.digest != before.digest and after.rows == before.rows
    assert load_manifest(_data(tmp_path), before.digest) == before  # the old version stays on record


def test_bookkeeping_files_are_not_data(tmp_path: Path) -> None:
    write_day(tmp_path.as_uri(), DAY, 300, seed=1)
    before = resolve_snapshot(_data(tmp_path), PARTITION)
    partition = tmp_path / PARTITION
    (partition / "_trainpipe").mkdir(exist_ok=True)
    (partition / "_trainpipe" / "stale.parquet").write_bytes(b"x")
    (partition / ".part-00000.parquet.crc").write_bytes(b"x")
    assert resolve_snapshot(_data(tmp_path), PARTITION).digest == before.digest
    write_day((tmp_path / "extra").as_uri(), DAY, 10, seed=9)
    (tmp_path / "extra" / PARTITION / "part-00000.parquet").rename(partition / "part-00001.parquet")
    assert resolve_snapshot(_data(tmp_path), PARTITION).digest != before.digest  # an added file is new data


def test_files_that_disagree_on_the_schema_are_named(tmp_path: Path) -> None:
    write_day(tmp_path.as_uri(), DAY, 300, seed=1)
    write_day((tmp_path / "other").as_uri(), DAY, 300, seed=1, problems=[Problem.parse("dtype:hour")])
    (tmp_path / "other" / PARTITION / "part-00000.parquet").rename(
        tmp_path / PARTITION / "part-00001.parquet"
    )
    with pytest.raises(
        SnapshotError,
        match=r"part-00001.parquet does not have the schema of .*part-00000.parquet.*hour: string",
    ):
        resolve_snapshot(_data(tmp_path), PARTITION)


def test_missing_partition_names_the_uri(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match=f"no \\*.parquet files under {tmp_path.as_uri()}/{PARTITION}"):
        resolve_snapshot(_data(tmp_path), PARTITION)
    with pytest.raises(SnapshotError, match="no snapshot with digest sha256:abc"):
        load_manifest(_data(tmp_path), "sha256:abc")


def test_csv_snapshot_counts_rows_and_types(tmp_path: Path) -> None:
    (tmp_path / PARTITION).mkdir()
    pcsv.write_csv(
        pa.table({"amount": [1.5, 2.0, 3.25], "is_fraud": [0, 1, 0]}), tmp_path / PARTITION / "part-0.csv"
    )
    manifest = resolve_snapshot(_data(tmp_path, "csv"), PARTITION)
    assert manifest.rows == 3 and manifest.columns == {"amount": "double", "is_fraud": "int64"}


def test_partition_ready_by_marker_and_by_rows(tmp_path: Path) -> None:
    uri = f"{tmp_path.as_uri()}/{PARTITION}"
    ready, why = partition_ready(uri, "parquet", "_SUCCESS", None)
    assert not ready and why == f"{uri}/_SUCCESS does not exist yet"
    write_day(tmp_path.as_uri(), DAY, 300, seed=1, files=2)
    assert partition_ready(uri, "parquet", "_SUCCESS", None)[0]
    assert partition_ready(uri, "parquet", None, 300) == (True, f"{uri} holds 300 row(s) in 2 file(s)")
    assert partition_ready(uri, "parquet", "_SUCCESS", 301) == (
        False,
        f"{uri} holds 300 row(s) in 2 file(s), fewer than 301",
    )


@pytest.mark.parametrize(
    ("partition", "problem"),
    [
        ("../escape", "'..' segment"),
        ("ds=1/../../etc", "'..' segment"),
        ("..", "'..' segment"),
        (".", "'.' segment"),
        ("a//b", "empty segment"),
        ("/etc/passwd", "absolute"),
        ("s3://other-bucket/x", "absolute"),
        ("C:\\x", "absolute"),
        ("ds=1\\..\\x", "backslash"),
        ("ds=1\x00", "control character"),
        ("ds=1\nx", "control character"),
        ("", "is empty"),
        (" ", "is empty"),
        ("_trainpipe/snapshots", "bookkeeping folder _trainpipe"),
    ],
)
def test_a_rendered_partition_must_stay_a_sub_path_of_data_uri(
    tmp_path: Path, partition: str, problem: str
) -> None:
    with pytest.raises(PartitionError, match=r"partition .* \(under data.uri file://") as caught:
        partition_uri(_data(tmp_path), partition)
    assert problem in str(caught.value) and repr(partition) in str(caught.value)


@pytest.mark.parametrize(
    "partition",
    ["ds=2026-01-02", "ds=2026-01-02/", "region=eu/ds=2026-01-02", "ds=2026-01-02 00:00", "a..b", "~x"],
)
def test_ordinary_partitions_join_under_data_uri(tmp_path: Path, partition: str) -> None:
    assert partition_uri(_data(tmp_path), partition) == f"{tmp_path.as_uri()}/{partition.rstrip('/')}"


def test_a_stored_manifest_must_hash_to_its_digest(tmp_path: Path) -> None:
    write_day(tmp_path.as_uri(), DAY, 800, seed=4, files=2)
    manifest = resolve_snapshot(_data(tmp_path), PARTITION)
    assert load_manifest(_data(tmp_path), manifest.digest) == manifest
    stored = next((tmp_path / "_trainpipe" / "snapshots").glob("*.json"))
    # Someone with write access to the store swaps a file's recorded hash (to bless other bytes).
    stored.write_text(stored.read_text().replace(manifest.files[0].sha256, "0" * 64))
    with pytest.raises(SnapshotError, match=f"does not hash to its digest {manifest.digest}: it was altered"):
        load_manifest(_data(tmp_path), manifest.digest)


def _windowed(root: Path, partitions: int, minimum: int | None = None) -> DataSection:
    return DataSection.model_validate(
        {
            "uri": root.as_uri(),
            "label": "is_fraud",
            "features": {"numeric": ["amount"]},
            "window": {"partitions": partitions, "min_partitions": minimum},
        }
    )


def test_a_window_is_one_snapshot_of_its_partitions_oldest_first(tmp_path: Path) -> None:
    days = [date(2026, 2, d) for d in (26, 27, 28)] + [date(2026, 3, 1)]
    written = {day: write_day(tmp_path.as_uri(), day, 50, seed=3, files=2) for day in days}
    data = _windowed(tmp_path, 4)
    window = partitions_for_date(data, "2026-03-01")
    assert window == ["ds=2026-02-26", "ds=2026-02-27", "ds=2026-02-28", "ds=2026-03-01"]

    manifest = resolve_window(data, window)
    assert manifest.file_uris == [uri for day in days for uri in written[day]]
    assert manifest.digest == content_digest(manifest.file_uris)
    assert (manifest.rows, manifest.window, manifest.missing) == (200, window, [])
    assert load_manifest(data, manifest.digest) == manifest  # stored like any snapshot
    assert manifest.window_tags() == {
        "trainpipe.data_window": "ds=2026-02-26 .. ds=2026-03-01",
        "trainpipe.data_partitions": "4",
        "trainpipe.data_missing": "-",
    }


def test_missing_partitions_below_the_minimum_are_named(tmp_path: Path) -> None:
    for day in (1, 2, 4, 6):
        write_day(tmp_path.as_uri(), date(2026, 3, day), 20, seed=1)
    (tmp_path / "ds=2026-03-05").mkdir()  # an empty folder is as missing as no folder
    window = partitions_for_date(_windowed(tmp_path, 6), "2026-03-06")

    assert missing_partitions(_windowed(tmp_path, 6, minimum=4), window) == ["ds=2026-03-03", "ds=2026-03-05"]
    kept = resolve_window(_windowed(tmp_path, 6, minimum=4), window)
    assert kept.window == ["ds=2026-03-01", "ds=2026-03-02", "ds=2026-03-04", "ds=2026-03-06"]
    assert kept.window_tags()["trainpipe.data_missing"] == "ds=2026-03-03, ds=2026-03-05"
    with pytest.raises(WindowError) as caught:
        resolve_window(_windowed(tmp_path, 6), window)
    message = str(caught.value)
    assert "has 4, fewer than data.window.min_partitions (6)" in message
    assert message.endswith("missing: ds=2026-03-03, ds=2026-03-05")
    assert not caught.value.retryable  # waiting will not bring back last week's data


def test_a_window_whose_partitions_disagree_on_the_schema_names_the_partition(tmp_path: Path) -> None:
    write_day(tmp_path.as_uri(), date(2026, 3, 1), 20, seed=1)
    old = tmp_path / "ds=2026-02-28"
    old.mkdir()
    pa.parquet.write_table(pa.table({"amount": [1.0], "is_fraud": [0]}), old / "part-00000.parquet")
    with pytest.raises(SnapshotError, match="partition ds=2026-02-28 of the window does not have the schema"):
        resolve_window(_windowed(tmp_path, 2), ["ds=2026-02-28", "ds=2026-03-01"])


def test_a_manifest_is_current_until_its_partition_changes(tmp_path: Path) -> None:
    files = write_day(tmp_path.as_uri(), DAY, 30, seed=1, files=2)
    manifest = resolve_snapshot(_data(tmp_path), PARTITION)
    assert is_current(manifest)
    Path(files[1].removeprefix("file://")).write_bytes(b"longer or shorter than before")
    assert not is_current(manifest)
    Path(files[1].removeprefix("file://")).unlink()
    assert not is_current(manifest)
