"""Frozen snapshots: a sql source's content-addressed files that outlive changes at the source, the
manifest that records where the rows came from, and a files source frozen by copy or by pinned
S3 object versions."""

from __future__ import annotations

import hashlib
import re
from datetime import date
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.config import load_config
from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.data.freeze import snapshot_for_date
from airflow_trainpipe.data.snapshots.manifests import load_manifest
from airflow_trainpipe.data.snapshots.store import freeze_file, frozen_uri
from airflow_trainpipe.data.sources import lineage_tags
from tests.helpers import warehouse

DAYS = [date(2026, 2, d) for d in range(1, 8)]


@pytest.fixture(scope="module")
def warehouse_url(postgres_server) -> str:
    url = warehouse.create_database(postgres_server.url, "freeze_tests")
    warehouse.load_days(url, DAYS, 400)
    return url


def test_a_file_is_stored_under_its_sha256_once(tmp_path: Path) -> None:
    store = (tmp_path / "store").as_uri()
    made = tmp_path / "part-00000.parquet"
    made.write_bytes(b"PAR1 rows PAR1")
    first = freeze_file(made, 3, store)
    sha = hashlib.sha256(made.read_bytes()).hexdigest()
    assert first.uri == frozen_uri(store, sha) and first.uri.endswith(f"/sha256/{sha[:2]}/{sha}.parquet")
    assert (first.sha256, first.size, first.rows) == (sha, 14, 3)
    stored = local_path(first.uri)
    stored.write_bytes(b"cut")  # a copy cut short by hand: same name, wrong size
    assert freeze_file(made, 3, store) == first and stored.read_bytes() == made.read_bytes()
    assert [p.name for p in stored.parent.iterdir()] == [stored.name]  # no partial copy left behind


def test_a_run_s_snapshot_stays_readable_after_the_source_changes(
    warehouse_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", warehouse_url)
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    config = load_config(warehouse.sql_config(tmp_path, partitions=3))
    before = snapshot_for_date(config, "2026-02-05")  # the window 02-03 .. 02-05
    assert before.rows == 3 * 400 and before.format == "parquet"
    assert before.source is not None
    assert (before.source.window_start, before.source.window_end) == (
        "2026-02-03T00:00:00+00:00",
        "2026-02-06T00:00:00+00:00",
    )
    assert (
        "event_time >= '2026-02-03T00:00:00+00:00' AND event_time < '2026-02-06T00:00:00+00:00'"
        in before.source.query
    )
    tags = lineage_tags(before)
    assert tags["trainpipe.data_source"] == "sql:warehouse"
    assert tags["trainpipe.data_window"] == "2026-02-03T00:00:00+00:00 .. 2026-02-06T00:00:00+00:00"
    assert tags["trainpipe.data_query_sha256"] == hashlib.sha256(before.source.query.encode()).hexdigest()
    assert all(f.uri.startswith(f"{config.snapshots.uri}/sha256/") for f in before.files)
    assert snapshot_for_date(config, "2026-02-05") == before  # same rows: same files, same digest

    # The warehouse rewrites a day of the window (a late correction) and drops another.
    warehouse.execute(
        warehouse_url,
        "UPDATE card_transactions SET amount = amount * 2 WHERE event_time >= '2026-02-04' AND event_time < '2026-02-05'",
        "DELETE FROM card_transactions WHERE event_time >= '2026-02-03' AND event_time < '2026-02-04'",
    )
    after = snapshot_for_date(config, "2026-02-05")
    assert after.digest != before.digest and after.rows == 2 * 400
    # The earlier snapshot is what it was: its manifest verifies and its files hold the old rows.
    kept = load_manifest(config.data, before.digest)
    assert kept == before
    for f in kept.files:
        assert hashlib.sha256(local_path(f.uri).read_bytes()).hexdigest() == f.sha256
    old = pq.read_table(local_path(kept.files[0].uri))
    assert old.num_rows == 3 * 400 and old.column("transaction_id")[0].as_py().startswith("20260203-")


def _files_config(tmp_path: Path) -> Path:
    import yaml

    from tests.conftest import EXAMPLE_CONFIGS

    config = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text())
    config["data"].update(uri=(tmp_path / "data").as_uri(), freeze=True, window={"partitions": 2})
    config["snapshots"] = {"uri": (tmp_path / "snapshots").as_uri()}
    path = tmp_path / "frozen_files.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_a_frozen_files_snapshot_trains_on_copies_an_overwritten_partition_cannot_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_trainpipe.data.snapshots.errors import SnapshotError
    from airflow_trainpipe.data.snapshots.store import freeze_manifest
    from airflow_trainpipe.examples.synthetic import write_day

    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    for day in (1, 2):
        write_day((tmp_path / "data").as_uri(), date(2026, 3, day), 300, seed=1)
    config = load_config(_files_config(tmp_path))
    frozen = snapshot_for_date(config, "2026-03-02")
    assert [f.uri.split("/sha256/")[0] for f in frozen.files] == [(tmp_path / "snapshots").as_uri()] * 2
    assert frozen.digest == load_manifest(config.data, frozen.digest).digest  # the same data version
    assert frozen.partition_uri == (tmp_path / "data").as_uri() + "/ds=2026-03-02"
    copies = {f.sha256: local_path(f.uri).read_bytes() for f in frozen.files}
    assert all(hashlib.sha256(b).hexdigest() == sha for sha, b in copies.items())
    use = tmp_path / "snapshots" / "uses" / "fraud_detector" / f"{frozen.digest.removeprefix('sha256:')}.json"
    assert use.is_file()  # what snapshots gc reads

    # Upstream rewrites a day: the copies are untouched, and a manifest that still names the old
    # bytes cannot be frozen from the new ones.
    unfrozen = load_manifest(config.data, frozen.digest)
    write_day((tmp_path / "data").as_uri(), date(2026, 3, 1), 310, seed=2)
    assert {f.sha256: local_path(f.uri).read_bytes() for f in frozen.files} == copies
    for path in (tmp_path / "snapshots" / "sha256").rglob("*.parquet"):
        path.unlink()
    with pytest.raises(
        SnapshotError, match=r"ds=2026-03-01/part-00000\.parquet changed after it was validated"
    ):
        freeze_manifest(config, unfrozen)


def test_freezing_needs_a_store_pods_can_read() -> None:
    import yaml

    from airflow_trainpipe.config import PipelineConfig
    from tests.conftest import EXAMPLE_CONFIGS

    config = yaml.safe_load((EXAMPLE_CONFIGS / "house_prices.yaml").read_text())  # a kubernetes example
    config["data"]["freeze"] = True
    with pytest.raises(ValueError, match=r"snapshots\.uri"):
        PipelineConfig.model_validate(config)
    config["snapshots"] = {"uri": "s3://ml-snapshots/trainpipe"}
    assert PipelineConfig.model_validate(config).data.freeze


def _versioned_config(tmp_path: Path, bucket: str, freeze: bool | str) -> Path:
    import yaml

    from tests.conftest import EXAMPLE_CONFIGS

    config = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text())
    config["data"].update(uri=f"s3://{bucket}/data", freeze=freeze, window={"partitions": 2})
    path = tmp_path / f"versions_{freeze}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_freeze_versions_pins_s3_object_versions_that_later_writes_cannot_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str
) -> None:
    import boto3

    from airflow_trainpipe.data.snapshots.manifests import is_current, resolve_snapshot
    from airflow_trainpipe.data.snapshots.partitions import unpinned, version_of
    from airflow_trainpipe.examples.synthetic import write_day
    from airflow_trainpipe.runtime.data.reader import ChangedDataError, DataError, iter_batches

    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="versioned-lake")
    s3.put_bucket_versioning(Bucket="versioned-lake", VersioningConfiguration={"Status": "Enabled"})
    for day in (1, 2):
        write_day("s3://versioned-lake/data", date(2026, 3, day), 300, seed=1)
    config = load_config(_versioned_config(tmp_path, "versioned-lake", "versions"))
    pinned = snapshot_for_date(config, "2026-03-02")
    versions = {
        f"s3://versioned-lake/{v['Key']}": v["VersionId"]
        for v in s3.list_object_versions(Bucket="versioned-lake")["Versions"]
    }
    assert [(unpinned(f.uri), version_of(f.uri)) for f in pinned.files] == [
        (uri, versions[uri])
        for uri in (
            "s3://versioned-lake/data/ds=2026-03-01/part-00000.parquet",
            "s3://versioned-lake/data/ds=2026-03-02/part-00000.parquet",
        )
    ]
    assert load_manifest(config.data, pinned.digest) == pinned
    first_day = resolve_snapshot(config.data, "ds=2026-03-01")  # what a window reuses for that day
    assert first_day.files == pinned.files[:1] and is_current(first_day)
    columns = ["amount", "is_fraud"]
    before = [t.to_pydict() for t in iter_batches(pinned.file_uris, "parquet", columns, manifest=pinned)]

    # Upstream rewrites a day in place. The pinned snapshot still reads the bytes it validated,
    # while the same files unpinned (freeze: false) now fail training's byte check.
    write_day("s3://versioned-lake/data", date(2026, 3, 1), 310, seed=2)
    assert not is_current(first_day)  # the day is validated again before a window reuses it
    after = [t.to_pydict() for t in iter_batches(pinned.file_uris, "parquet", columns, manifest=pinned)]
    assert after == before and sum(len(t["amount"]) for t in after) == 600
    unpinned_manifest = pinned.model_copy(
        update={"files": [f.model_copy(update={"uri": unpinned(f.uri)}) for f in pinned.files]}
    )
    with pytest.raises(ChangedDataError, match=r"ds=2026-03-01/part-00000\.parquet changed"):
        list(iter_batches(unpinned_manifest.file_uris, "parquet", columns, manifest=unpinned_manifest))
    again = snapshot_for_date(config, "2026-03-02")  # the new day's version: another data version
    assert again.digest != pinned.digest and again.rows == 610

    # A lifecycle rule expires the pinned version: reading it fails, naming the file.
    gone = pinned.files[0].uri
    s3.delete_object(Bucket="versioned-lake", Key=unpinned(gone).split("/", 3)[3], VersionId=version_of(gone))
    with pytest.raises(DataError, match=re.escape(f"cannot read {gone}")):
        list(iter_batches(pinned.file_uris, "parquet", columns, manifest=pinned))


def test_freeze_versions_refuses_an_unversioned_bucket_and_a_local_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str
) -> None:
    import boto3

    from airflow_trainpipe.core.exceptions import ConfigError
    from airflow_trainpipe.data.snapshots.errors import UnversionedError
    from airflow_trainpipe.examples.synthetic import write_day
    from tests.conftest import EXAMPLE_CONFIGS

    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="plain-lake")
    for day in (1, 2):
        write_day("s3://plain-lake/data", date(2026, 3, day), 50, seed=1)
    config = load_config(_versioned_config(tmp_path, "plain-lake", "versions"))
    with pytest.raises(
        UnversionedError,
        match=r"s3://plain-lake/data/ds=2026-03-01/part-00000\.parquet has no object version",
    ) as caught:
        snapshot_for_date(config, "2026-03-02")
    assert not caught.value.retryable

    local = _versioned_config(tmp_path, "plain-lake", "versions")
    local.write_text(local.read_text().replace("s3://plain-lake/data", (tmp_path / "data").as_uri()))
    with pytest.raises(ConfigError, match=r"data\.freeze.*data\.uri must be an s3:// bucket"):
        load_config(local)
    spark = _versioned_config(tmp_path, "plain-lake", "versions")
    spark.write_text(spark.read_text().replace("validation:\n", "validation:\n  engine: spark\n", 1))
    with pytest.raises(ConfigError, match=r"validation\.engine.*cannot read a pinned object version"):
        load_config(spark)
    sql = tmp_path / "sql_versions.yaml"
    sql.write_text(
        (EXAMPLE_CONFIGS / "fraud_detector_sql.yaml")
        .read_text()
        .replace("  source:", "  freeze: versions\n  source:", 1)
    )
    with pytest.raises(ConfigError, match=r"data\.freeze.*a sql source is always frozen"):
        load_config(sql)
