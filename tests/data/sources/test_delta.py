"""The delta source on real Delta tables written by `deltalake.write_deltalake`, partitioned by a
date column: the export's bytes whatever files hold the rows, the partition columns restored, the
window's bounds, the lineage, a snapshot that outlives a vacuum, and every bad input named,
retried only when a retry can help. The external sort itself: test_sorted_export.py."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_trainpipe.config import load_config
from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.config.sources import DeltaSource
from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.data.freeze import snapshot_for_date
from airflow_trainpipe.data.snapshots.manifests import load_manifest
from airflow_trainpipe.data.sources import delta, lineage_tags, source_kind
from airflow_trainpipe.data.sources.errors import SourceError, SourceUnavailable
from airflow_trainpipe.data.window import TimeWindow
from tests.helpers import lake

DAYS = [date(2026, 3, d) for d in range(1, 6)]
ROWS_PER_DAY = 1_200
# 2026-03-02 .. 2026-03-04: three of the table's five days.
WINDOW = TimeWindow(datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 3, 5, tzinfo=UTC))


def _source(uri: str | Path, **overrides: object) -> DeltaSource:
    location = uri.as_uri() if isinstance(uri, Path) else uri
    fields = {"kind": "delta", "uri": location, "time_column": "event_time", "order_by": ["transaction_id"]}
    return DeltaSource.model_validate({**fields, **overrides})


def _export(source: DeltaSource, folder: Path, window: TimeWindow = WINDOW) -> delta.DeltaExport:
    folder.mkdir(parents=True, exist_ok=True)
    return delta.export(source, window, folder)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read(exported: delta.DeltaExport) -> pa.Table:
    return pa.concat_tables([pq.read_table(f.path) for f in exported.files])


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five days, one commit each (the order a daily loader writes them)."""
    uri = tmp_path_factory.mktemp("lake") / "transactions"
    lake.write_days(uri, DAYS, ROWS_PER_DAY)
    return uri


def test_the_same_rows_give_the_same_bytes_whatever_files_and_log_order_hold_them(
    table: Path, tmp_path: Path
) -> None:
    """The same rows written newest day first, shuffled, two commits a day: other files in another
    order, the same export. 3,600 rows sorted 1,000 at a time (four spilled runs, merged) give the
    bytes an export sorted in one piece gives, cut the same way."""
    other = tmp_path / "reordered"
    lake.write_days(other, DAYS, ROWS_PER_DAY, shuffle=7)
    assert len(DeltaTable(str(other)).file_uris()) == 2 * len(DAYS) != len(DeltaTable(str(table)).file_uris())
    source = {"batch_rows": 500, "file_rows": 1_000}
    runs = [
        _export(_source(table, **source), tmp_path / "a"),
        _export(_source(other, **source), tmp_path / "b"),
        _export(_source(table, **source), tmp_path / "c"),
    ]
    digests = [[_sha(f.path) for f in run.files] for run in runs]
    assert digests[0] == digests[1] == digests[2]
    first = runs[0]
    assert [f.rows for f in first.files] == [1_000, 1_000, 1_000, 600]
    groups = [pq.ParquetFile(f.path).metadata for f in first.files]
    assert [m.row_group(g).num_rows for m in groups for g in range(m.num_row_groups)] == [500] * 7 + [100]
    ids = _read(first).column("transaction_id").to_pylist()
    assert ids == sorted(ids) and len(ids) == 3 * ROWS_PER_DAY
    assert ids[0].startswith("20260302-") and ids[-1].startswith("20260304-")
    whole = _export(_source(table, batch_rows=500, file_rows=10_000), tmp_path / "whole")
    assert _read(whole).equals(_read(first))  # the merge orders rows as one in-memory sort does


def test_partition_columns_are_restored_with_the_table_s_types(tmp_path: Path) -> None:
    """Delta data files do not carry their partition columns (they are in the folder names and
    the log): the export has them back, a date as date32 and a string as a string."""
    uri = tmp_path / "by_day_and_channel"
    lake.write_days(uri, DAYS[:3], 300, partition_by=("ds", "channel"))
    data_file = DeltaTable(str(uri)).file_uris()[0]
    assert "ds=" in data_file and "channel=" in data_file
    assert {"ds", "channel"}.isdisjoint(pq.read_schema(data_file).names)
    window = TimeWindow(datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 3, 4, tzinfo=UTC))
    exported = _export(_source(uri), tmp_path / "out", window)
    rows = _read(exported)
    assert (
        exported.schema.field("ds").type == pa.date32()
        and exported.schema.field("channel").type == pa.string()
    )
    assert set(rows.column("ds").to_pylist()) == {date(2026, 3, 2), date(2026, 3, 3)}
    expected = pa.concat_tables([lake.day_table(day, 300) for day in DAYS[1:3]])
    by_id = dict(
        zip(
            expected.column("transaction_id").to_pylist(), expected.column("channel").to_pylist(), strict=True
        )
    )
    assert (
        dict(zip(rows.column("transaction_id").to_pylist(), rows.column("channel").to_pylist(), strict=True))
        == by_id
    )
    # A date partition column is a time column like any other: its files are pruned.
    by_day = _export(_source(uri, time_column="ds"), tmp_path / "by_day", window)
    assert _read(by_day).equals(rows)
    assert by_day.scan.filter_text == "((ds >= 2026-03-02) and (ds < 2026-03-04))"


BOUNDARY = [
    datetime(2026, 1, 1, 23, 59, 59, 999_999, tzinfo=UTC),
    datetime(2026, 1, 2, 0, 0, tzinfo=UTC),
    datetime(2026, 1, 2, 5, 59, 59, 999_999, tzinfo=UTC),
    datetime(2026, 1, 2, 6, 0, tzinfo=UTC),
    datetime(2026, 1, 2, 11, 59, 59, 999_999, tzinfo=UTC),
    datetime(2026, 1, 2, 12, 0, tzinfo=UTC),
    datetime(2026, 1, 2, 23, 59, 59, 999_999, tzinfo=UTC),
    datetime(2026, 1, 3, 0, 0, tzinfo=UTC),
]


@pytest.fixture(scope="module")
def instants(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One row per instant around a day's and a six-hour window's bounds, the instant in every
    type a time column may have."""
    uri = tmp_path_factory.mktemp("instants") / "events"
    write_deltalake(
        str(uri),
        pa.table(
            {
                "id": list(range(len(BOUNDARY))),
                "at": pa.array(BOUNDARY, pa.timestamp("us", tz="UTC")),
                "at_ntz": pa.array([t.replace(tzinfo=None) for t in BOUNDARY], pa.timestamp("us")),
                "at_text": [t.strftime("%Y-%m-%dT%H:%M:%S.%f") for t in BOUNDARY],
                "day_text": [t.date().isoformat() for t in BOUNDARY],
                "day": pa.array([t.date() for t in BOUNDARY], pa.date32()),
            }
        ),
        partition_by=["day"],
    )
    return uri


@pytest.mark.parametrize("column", ["at", "at_ntz", "at_text", "day_text", "day"])
def test_the_window_is_half_open_in_every_time_column_type(
    instants: Path, tmp_path: Path, column: str
) -> None:
    def ids(start: datetime, end: datetime) -> list[int]:
        try:
            exported = _export(
                _source(instants, time_column=column, order_by=["id"]),
                tmp_path / f"{start:%H}",
                TimeWindow(start, end),
            )
        except SourceError as exc:
            assert "has no rows in the run's window" in str(exc)
            return []
        return _read(exported).column("id").to_pylist()

    day = ids(datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 1, 3, tzinfo=UTC))
    assert day == [1, 2, 3, 4, 5, 6]  # 00:00 in, 23:59:59.999999 in, the next midnight out
    six_hours = ids(datetime(2026, 1, 2, 6, tzinfo=UTC), datetime(2026, 1, 2, 12, tzinfo=UTC))
    across_midnight = ids(datetime(2026, 1, 1, 18, tzinfo=UTC), datetime(2026, 1, 2, 6, tzinfo=UTC))
    if column in ("day", "day_text"):
        # A date is its midnight: a window of hours holds the dates whose midnight it holds.
        assert (six_hours, across_midnight) == ([], [1, 2, 3, 4, 5, 6])
    else:
        assert (six_hours, across_midnight) == ([3, 4], [0, 1, 2])


def test_a_time_column_of_another_type_is_refused(instants: Path, tmp_path: Path) -> None:
    with pytest.raises(
        SourceError, match=r"time_column 'id' of .*events is int64; expected a timestamp, date or string"
    ) as caught:
        _export(_source(instants, time_column="id", order_by=["id"]), tmp_path)
    assert caught.value.retryable is False


def test_ties_in_the_key_fail_naming_the_rows(table: Path, tmp_path: Path) -> None:
    with pytest.raises(
        SourceError,
        match=r"does not order the rows completely: rows \d+ and \d+ of the result both have \{'channel': 'atm'\}",
    ) as caught:
        _export(_source(table, order_by=["channel"], file_rows=1_000), tmp_path)
    assert caught.value.retryable is False


def _missing_file(table: Path, tmp_path: Path) -> DeltaSource:
    copy = tmp_path / "damaged"
    lake.write_days(copy, DAYS[1:3], 50)
    Path(DeltaTable(str(copy)).file_uris()[0]).unlink()  # deleted by hand
    return _source(copy)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda t, tmp: _source(tmp / "nowhere"), r"no Delta table at file://.*/nowhere \(data.source.uri\)"),
        (
            lambda t, tmp: _source(t, time_column="nope"),
            r"transactions \(version 4\) has no column nope \(data.source names it\); it has transaction_id, ",
        ),
        (lambda t, tmp: _source(t, order_by=["nope", "transaction_id"]), r"has no column nope"),
        (lambda t, tmp: _source(t, columns=["transaction_id", "gone", "amount"]), r"has no column gone"),
        (
            lambda t, tmp: _source(t, time_column="ds"),
            None,  # the control: the same table and window read fine
        ),
        (
            _missing_file,
            r"reading version 1 of file://.*/damaged: a data file of the version being read no longer exists",
        ),
    ],
    ids=["no table", "no time column", "no key column", "no listed column", "control", "a data file deleted"],
)
def test_a_table_that_cannot_give_the_window_is_named_and_not_retried(
    table: Path, tmp_path: Path, make, message: str | None
) -> None:
    source = make(table, tmp_path)
    if message is None:
        assert _export(source, tmp_path / "out").files
        return
    with pytest.raises(SourceError, match=message) as caught:
        _export(source, tmp_path / "out")
    assert caught.value.retryable is False


def test_a_window_without_rows_names_the_table_version_and_filter(table: Path, tmp_path: Path) -> None:
    empty = TimeWindow(datetime(2026, 4, 1, tzinfo=UTC), datetime(2026, 4, 2, tzinfo=UTC))
    with pytest.raises(
        SourceError,
        match=r"transactions \(version 4\) has no rows in the run's window \(\(\(event_time >= 2026-04-01 00:00:00.000000Z\) and \(event_time < 2026-04-02",
    ) as caught:
        _export(_source(table), tmp_path, empty)
    assert caught.value.retryable is False


def test_a_version_vacuumed_while_it_is_read_is_named(tmp_path: Path) -> None:
    """The export opened version 0; before it read the files, a writer overwrote the table and a
    vacuum with no retention deleted version 0's files."""
    uri = tmp_path / "busy"
    lake.write_days(uri, DAYS[1:4], 100)
    scan = delta.window_scan(_source(uri), WINDOW)
    lake.write_days(uri, DAYS[1:4], 100, seed=5, mode="overwrite")
    removed = DeltaTable(str(uri)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert removed
    (tmp_path / "out").mkdir()
    with pytest.raises(
        SourceError,
        match=r"reading version 2 of .*busy: a data file of the version being read no longer exists",
    ) as caught:
        delta.export_scan(_source(uri), scan, tmp_path / "out")
    assert caught.value.retryable is False


def test_a_table_needing_a_reader_feature_pyarrow_lacks_is_named(tmp_path: Path) -> None:
    """Deletion vectors (Databricks writes them) cannot be applied by the Arrow dataset reader."""
    uri = tmp_path / "with_deletion_vectors"
    lake.write_days(uri, DAYS[1:2], 10)
    protocol = {
        "protocol": {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors"],
            "writerFeatures": ["deletionVectors"],
        }
    }
    (uri / "_delta_log" / f"{1:020d}.json").write_text(json.dumps(protocol) + "\n")
    with pytest.raises(
        SourceError,
        match=r"reading version 1 of .*: the table needs a reader feature this reader lacks: .*deletionVectors",
    ) as caught:
        _export(_source(uri), tmp_path / "out")
    assert caught.value.retryable is False


def test_storage_that_cannot_be_reached_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import free_port

    extra = {"region_name": "us-east-1", "endpoint_url": f"http://127.0.0.1:{free_port()}"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_DOWN",
        json.dumps({"conn_type": "aws", "login": "testing", "password": "testing", "extra": extra}),
    )
    with pytest.raises(
        SourceUnavailable, match=r"opening s3://lake/transactions: .*Connection refused"
    ) as caught:
        delta.window_scan(_source("s3://lake/transactions", conn_id="lake_down"), WINDOW)
    assert caught.value.retryable is True


def test_a_refused_connection_whose_timing_holds_403_is_retried() -> None:
    """delta-rs's message for an unreachable S3 endpoint carries its retries' timing; "1.840371s"
    holds the digits 403, which once made an outage final (a storage 403 is the refusal)."""
    down = OSError(
        "Kernel error -> Generic S3 error Error performing GET http://127.0.0.1:57401/lake/transactions/"
        "_delta_log/_last_checkpoint in 1.840371s, after 10 retries, max_retries 10, retry_timeout 180s"
        " - HTTP error error sending request client error (Connect) tcp connect error Connection refused"
    )
    assert isinstance(delta._classified(down, "s3://lake/transactions", "opening"), SourceUnavailable)
    forbidden = OSError("Generic S3 error: Client error with status 403: <Code>InvalidToken</Code>")
    refused = delta._classified(forbidden, "s3://lake/transactions", "opening")
    assert not isinstance(refused, SourceUnavailable) and refused.retryable is False


def test_an_s3_table_is_read_with_an_airflow_aws_connection(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    options = {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
    uri = "s3://trainpipe/lake/transactions"
    for day in DAYS[1:3]:
        write_deltalake(
            uri, lake.day_table(day, 200), partition_by=["ds"], mode="append", storage_options=options
        )
    extra = {"region_name": "us-east-1", "endpoint_url": s3_endpoint}
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE",
        json.dumps({"conn_type": "aws", "login": "testing", "password": "testing", "extra": extra}),
    )
    assert delta.storage_options(uri, "lake") == options
    exported = _export(_source(uri, conn_id="lake"), tmp_path)
    assert exported.scan.version == 1 and sum(f.rows for f in exported.files) == 400
    monkeypatch.delenv("AIRFLOW_CONN_NOWHERE", raising=False)
    with pytest.raises(SourceError, match="Airflow connection 'nowhere' is not defined"):
        delta.storage_options(uri, "nowhere")
    with pytest.raises(SourceError, match=r"for s3:// tables only; gs://b/t reads its storage's credentials"):
        delta.storage_options("gs://b/t", "lake")
    assert delta.storage_options((tmp_path / "t").as_uri(), "lake") is None


def test_a_snapshot_records_the_version_and_outlives_an_overwrite_and_a_vacuum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    uri = tmp_path / "lake" / "transactions"
    lake.write_days(uri, DAYS, 400)
    config = load_config(
        lake.delta_config(tmp_path, uri.as_uri(), partitions=3, batch_rows=250, file_rows=500)
    )
    before = snapshot_for_date(config, "2026-03-04")  # the window 03-02 .. 03-04
    assert before.rows == 3 * 400 and before.format == "parquet" and len(before.files) == 3
    assert before.source is not None
    assert (before.source.kind, before.source.table, before.source.version) == ("delta", uri.as_uri(), 4)
    assert (before.source.window_start, before.source.window_end) == (
        "2026-03-02T00:00:00+00:00",
        "2026-03-05T00:00:00+00:00",
    )
    assert before.source.filter == (
        "((event_time >= 2026-03-02 00:00:00.000000Z) and (event_time < 2026-03-05 00:00:00.000000Z))"
    )
    assert lineage_tags(before) == {
        "trainpipe.data_source": f"delta:{uri.as_uri()}",
        "trainpipe.data_window": "2026-03-02T00:00:00+00:00 .. 2026-03-05T00:00:00+00:00",
        "trainpipe.data_table_version": "4",
        "trainpipe.data_filter": before.source.filter,
    }
    assert all(f.uri.startswith(f"{config.snapshots.uri}/sha256/") for f in before.files)
    assert snapshot_for_date(config, "2026-03-04") == before  # same version, same rows: same snapshot

    # The table is rewritten (other rows, a day fewer) and vacuumed: version 4's files are gone.
    lake.write_days(uri, DAYS[1:], 400, seed=8, mode="overwrite")
    removed = DeltaTable(str(uri)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert len(removed) == len(DAYS)
    after = snapshot_for_date(config, "2026-03-04")
    assert after.digest != before.digest and after.source is not None
    assert after.source.version == DeltaTable(str(uri)).version() > 8  # 4 commits, and the vacuum's
    # The earlier snapshot is what it was: its manifest verifies and its files hold the old rows.
    kept = load_manifest(config.data, before.digest)
    assert kept == before
    for f in kept.files:
        assert _sha(local_path(f.uri)) == f.sha256
    old = pq.read_table(local_path(kept.files[0].uri))
    assert old.column("transaction_id")[0].as_py() == "20260302-0-00000000"
    assert list(old.schema.names) == config.data.source.columns  # type: ignore[union-attr]


def test_a_manifest_stored_before_delta_lineage_existed_still_loads(tmp_path: Path) -> None:
    from airflow_trainpipe.contracts.manifest import Manifest

    stored = {
        "kind": "sql",
        "conn_id": "warehouse",
        "query": "SELECT 1",
        "window_start": "2026-01-01T00:00:00+00:00",
        "window_end": "2026-01-02T00:00:00+00:00",
    }
    manifest = Manifest.model_validate(
        {
            "partition_uri": "file:///r/ds=2026-01-01",
            "format": "parquet",
            "files": [],
            "rows": 0,
            "columns": {},
            "digest": "sha256:x",
            "source": stored,
        }
    )
    assert manifest.source is not None and manifest.source.table is None and manifest.source.version is None
    assert source_kind("sql").lineage_tags(manifest.source)["trainpipe.data_source"] == "sql:warehouse"
    assert source_kind("sql").origin(manifest.source) == "warehouse"


def test_the_config_of_a_delta_source() -> None:
    base = {"uri": "x", "label": "is_fraud", "features": {"numeric": ["amount"]}}
    source = _source("lake/t").model_dump()
    parsed = DataSection.model_validate({**base, "source": source})
    assert (parsed.wait.marker, parsed.wait.min_rows) == (None, 1)
    kept = DataSection.model_validate({**base, "source": source, "wait": {"min_rows": 500, "mode": "poke"}})
    assert (kept.wait.marker, kept.wait.min_rows, kept.wait.mode) == (None, 500, "poke")
    for data, message in (
        ({**base, "source": source, "format": "csv"}, "format: a delta source is exported as parquet"),
        (
            {**base, "source": source, "wait": {"marker": "_SUCCESS"}},
            "wait.marker: a delta source has no marker file",
        ),
        ({**base, "source": {**source, "order_by": []}}, "at least 1 item"),
        (
            {**base, "source": {**source, "columns": ["amount"]}},
            r"must include the order_by column\(s\) transaction_id",
        ),
        ({**base, "source": {**source, "columns": ["transaction_id", "a", "a"]}}, "lists a more than once"),
        ({**base, "source": {**source, "columns": []}}, "at least 1 item"),
        ({**base, "source": {**source, "conn_id": ""}}, "at least 1 character"),
    ):
        with pytest.raises(ValueError, match=message):
            DataSection.model_validate(data)


def test_window_bounds_of_a_date_column_are_the_dates_whose_midnight_is_inside() -> None:
    field = pa.field("ds", pa.date32())
    hours = TimeWindow(datetime(2026, 1, 1, 18, tzinfo=UTC), datetime(2026, 1, 3, 6, tzinfo=UTC))
    assert str(delta.window_filter(field, hours, "t")) == "((ds >= 2026-01-02) and (ds < 2026-01-04))"
    days = TimeWindow(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=30))
    assert str(delta.window_filter(field, days, "t")) == "((ds >= 2026-01-01) and (ds < 2026-01-31))"
