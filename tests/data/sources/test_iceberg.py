"""The iceberg source on real Iceberg tables of a SQL catalog (SQLite, a local warehouse) opened
through Airflow's Iceberg hook, partitioned by day(event_time): the export's bytes whatever files
and commits hold the rows (and equal to a Delta export of the same rows), the hidden partition
pruning files, the window's bounds in every time column type, the lineage, a snapshot that
outlives an overwrite and the snapshots' expiry, and every bad input named, retried only when a
retry can help."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.config import load_config
from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.config.sources import DeltaSource, IcebergSource
from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.data.freeze import snapshot_for_date
from airflow_trainpipe.data.snapshots.manifests import load_manifest
from airflow_trainpipe.data.sources import delta, iceberg, lineage_tags, source_kind
from airflow_trainpipe.data.sources.errors import SourceError, SourceUnavailable
from airflow_trainpipe.data.window import TimeWindow
from airflow_trainpipe.examples.iceberg_table import connection
from tests.helpers import iceberg_lake, lake
from tests.helpers.warehouse import COLUMNS

DAYS = [date(2026, 3, d) for d in range(1, 6)]
ROWS_PER_DAY = 1_200
# 2026-03-02 .. 2026-03-04: three of the table's five days.
WINDOW = TimeWindow(datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 3, 5, tzinfo=UTC))
NAMES = [c.strip() for c in COLUMNS.split(",")]


def _source(table: str = iceberg_lake.TABLE, **overrides: object) -> IcebergSource:
    fields = {
        "kind": "iceberg",
        "conn_id": iceberg_lake.CONN_ID,
        "table": table,
        "time_column": "event_time",
        "order_by": ["transaction_id"],
    }
    return IcebergSource.model_validate({**fields, **overrides})


def _export(source: IcebergSource, folder: Path, window: TimeWindow = WINDOW) -> iceberg.IcebergExport:
    folder.mkdir(parents=True, exist_ok=True)
    return iceberg.export(source, window, folder)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read(files: list) -> pa.Table:
    return pa.concat_tables([pq.read_table(f.path) for f in files])


@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five days, one commit each (the order a daily loader writes them)."""
    folder = tmp_path_factory.mktemp("iceberg")
    iceberg_lake.write_days(iceberg_lake.table(folder), DAYS, ROWS_PER_DAY)
    return folder


@pytest.fixture
def lake_conn(catalog_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The connection `lake` to the five-day catalog."""
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", connection(catalog_dir))
    return catalog_dir


def test_the_same_rows_give_the_same_bytes_whatever_files_commits_or_format_hold_them(
    lake_conn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same rows written newest day first, shuffled, two files a day: other files in another
    order, the same export, sorted 1,000 rows at a time (spilled runs, merged). A Delta table of
    the same rows exports the same bytes: plain Arrow types, no Iceberg field ids."""
    other = iceberg_lake.table(tmp_path / "other", conn_id="other")
    iceberg_lake.write_days(other, DAYS, ROWS_PER_DAY, shuffle=7)
    monkeypatch.setenv("AIRFLOW_CONN_OTHER", connection(tmp_path / "other"))
    sizes = {"batch_rows": 500, "file_rows": 1_000, "columns": NAMES}
    first = _export(_source(**sizes), tmp_path / "a")
    again = _export(_source(conn_id="other", **sizes), tmp_path / "b")
    assert [_sha(f.path) for f in first.files] == [_sha(f.path) for f in again.files]
    assert [f.rows for f in first.files] == [1_000, 1_000, 1_000, 600]
    assert first.schema.field("transaction_id").type == pa.string() and first.schema.metadata is None
    ids = _read(first.files).column("transaction_id").to_pylist()
    assert ids == sorted(ids) and ids[0].startswith("20260302-") and ids[-1].startswith("20260304-")

    lake.write_days(tmp_path / "delta", DAYS, ROWS_PER_DAY)
    folder = tmp_path / "delta-export"
    folder.mkdir()
    from_delta = delta.export(
        DeltaSource(
            kind="delta",
            uri=(tmp_path / "delta").as_uri(),
            time_column="event_time",
            order_by=["transaction_id"],
            **sizes,  # type: ignore[arg-type]
        ),
        WINDOW,
        folder,
    )
    assert [_sha(f.path) for f in from_delta.files] == [_sha(f.path) for f in first.files]


def test_the_hidden_day_partition_prunes_files_and_the_time_column_comes_back(
    lake_conn: Path, tmp_path: Path
) -> None:
    """day(event_time) is a partition of no column: the window's filter is projected onto it, so
    only the window's three day files are planned, the count comes from their manifest entries
    (each lies wholly inside the window: no file is read), and event_time is in the rows."""
    scan = iceberg.window_scan(_source(), WINDOW)
    tasks = list(scan.scan.plan_files())
    assert sorted(t.file.file_path.split("/")[-2] for t in tasks) == [
        "event_time_day=2026-03-02",
        "event_time_day=2026-03-03",
        "event_time_day=2026-03-04",
    ]
    assert {str(t.residual) for t in tasks} == {"AlwaysTrue()"}  # counted from the manifests
    assert iceberg.count_rows(_source(), WINDOW)[0] == 3 * ROWS_PER_DAY
    exported = _export(_source(), tmp_path)
    assert exported.schema.names == [*NAMES, "event_time"]
    times = _read(exported.files).column("event_time")
    assert times.type == pa.timestamp("us", tz="UTC")
    assert (min(times.to_pylist()), max(times.to_pylist())) == (
        datetime(2026, 3, 2, tzinfo=UTC),
        datetime(2026, 3, 4, 23, 58, 48, tzinfo=UTC),  # the 1,200th second share of a day
    )
    assert exported.scan.filter_text == (
        "event_time >= '2026-03-02T00:00:00+00:00' AND event_time < '2026-03-05T00:00:00+00:00'"
    )


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
    type a time column may have, in an unpartitioned table `events.instants`."""
    folder = tmp_path_factory.mktemp("instants")
    rows = pa.table(
        {
            "id": list(range(len(BOUNDARY))),
            "at": pa.array(BOUNDARY, pa.timestamp("us", tz="UTC")),
            "at_ntz": pa.array([t.replace(tzinfo=None) for t in BOUNDARY], pa.timestamp("us")),
            "at_text": [t.strftime("%Y-%m-%dT%H:%M:%S.%f") for t in BOUNDARY],
            "day_text": [t.date().isoformat() for t in BOUNDARY],
            "day": pa.array([t.date() for t in BOUNDARY], pa.date32()),
        }
    )
    catalog = iceberg_lake.catalog(folder)
    catalog.create_namespace("events")
    catalog.create_table("events.instants", schema=rows.schema).append(rows)
    return folder


@pytest.mark.parametrize("column", ["at", "at_ntz", "at_text", "day_text", "day"])
def test_the_window_is_half_open_in_every_time_column_type(
    instants: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, column: str
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", connection(instants))

    def ids(start: datetime, end: datetime) -> list[int]:
        source = _source("events.instants", time_column=column, order_by=["id"])
        try:
            exported = _export(source, tmp_path / f"{start:%d%H}-{end:%d%H}", TimeWindow(start, end))
        except SourceError as exc:
            assert "has no rows in the run's window" in str(exc)
            return []
        return _read(exported.files).column("id").to_pylist()

    day = ids(datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 1, 3, tzinfo=UTC))
    assert day == [1, 2, 3, 4, 5, 6]  # 00:00 in, 23:59:59.999999 in, the next midnight out
    six_hours = ids(datetime(2026, 1, 2, 6, tzinfo=UTC), datetime(2026, 1, 2, 12, tzinfo=UTC))
    across_midnight = ids(datetime(2026, 1, 1, 18, tzinfo=UTC), datetime(2026, 1, 2, 6, tzinfo=UTC))
    if column in ("day", "day_text"):
        # A date is its midnight: a window of hours holds the dates whose midnight it holds.
        assert (six_hours, across_midnight) == ([], [1, 2, 3, 4, 5, 6])
    else:
        assert (six_hours, across_midnight) == ([3, 4], [0, 1, 2])


def test_a_time_column_of_another_type_is_refused(
    instants: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_LAKE", connection(instants))
    with pytest.raises(
        SourceError,
        match=r"time_column 'id' of Iceberg table events.instants \(snapshot \d+, catalog lake\) is long; "
        "expected a timestamp, date or string",
    ) as caught:
        _export(_source("events.instants", time_column="id", order_by=["id"]), tmp_path)
    assert caught.value.retryable is False


def test_the_filter_text_is_the_filter_the_scan_runs() -> None:
    """The manifest's filter parses back, in pyiceberg's own syntax, to the scan's expression,
    for a column named like a keyword or with a space too."""
    from pyiceberg.expressions import parser
    from pyiceberg.schema import Schema
    from pyiceberg.types import DateType, NestedField, StringType, TimestampType

    schema = Schema(
        NestedField(1, "in", DateType()),
        NestedField(2, "event time", TimestampType()),
        NestedField(3, "ds", StringType()),
    )
    window = TimeWindow(datetime(2026, 1, 1, 6, tzinfo=UTC), datetime(2026, 1, 2, 6, tzinfo=UTC))
    texts = {}
    for column in ("in", "event time", "ds"):
        expression, texts[column] = iceberg.window_filter(schema, column, window, "t")
        assert parser.parse(texts[column]) == expression
    assert texts == {
        "in": "\"in\" >= '2026-01-02' AND \"in\" < '2026-01-03'",
        "event time": "\"event time\" >= '2026-01-01T06:00:00' AND \"event time\" < '2026-01-02T06:00:00'",
        "ds": "ds >= '2026-01-01T06:00:00' AND ds < '2026-01-02T06:00:00'",
    }


def test_ties_in_the_key_fail_naming_the_rows(lake_conn: Path, tmp_path: Path) -> None:
    with pytest.raises(
        SourceError,
        match=r"does not order the rows completely: rows \d+ and \d+ of the result both have \{'channel': 'atm'\}",
    ) as caught:
        _export(_source(order_by=["channel"], file_rows=1_000), tmp_path)
    assert caught.value.retryable is False


def _missing_file(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> IcebergSource:
    damaged = iceberg_lake.table(tmp_path / "damaged", monkeypatch, conn_id="damaged")
    iceberg_lake.write_days(damaged, DAYS[1:3], 50)
    local_path(next(iter(damaged.refresh().scan().plan_files())).file.file_path).unlink()  # deleted by hand
    return _source(conn_id="damaged")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda f, tmp, mp: _source(conn_id="nowhere"),
            r"Airflow connection 'nowhere' is not defined \(data.source.conn_id\)",
        ),
        (
            lambda f, tmp, mp: _source("sales.nope"),
            r"loading Iceberg table sales.nope \(catalog lake\): it does not exist \(data.source.table\): "
            r"Table does not exist: sales.nope",
        ),
        (lambda f, tmp, mp: _source("nope.card_transactions"), r"it does not exist \(data.source.table\)"),
        (
            lambda f, tmp, mp: _source(time_column="nope"),
            r"Iceberg table sales.card_transactions \(snapshot \d+, catalog lake\) has no column nope "
            r"\(data.source names it\); it has transaction_id, ",
        ),
        (lambda f, tmp, mp: _source(order_by=["nope", "transaction_id"]), r"has no column nope"),
        (lambda f, tmp, mp: _source(columns=["transaction_id", "gone", "amount"]), r"has no column gone"),
        (lambda f, tmp, mp: _source(columns=NAMES), None),  # the control: the same table reads fine
        (
            _missing_file,
            r"reading Iceberg table sales.card_transactions \(snapshot \d+, catalog damaged\): a file of "
            r"the snapshot being read no longer exists",
        ),
    ],
    ids=[
        "no connection",
        "no table",
        "no namespace",
        "no time column",
        "no key column",
        "no listed column",
        "control",
        "a data file deleted",
    ],
)
def test_a_table_that_cannot_give_the_window_is_named_and_not_retried(
    lake_conn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make, message: str | None
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_NOWHERE", raising=False)
    source = make(lake_conn, tmp_path, monkeypatch)
    if message is None:
        assert _export(source, tmp_path / "out").files
        return
    with pytest.raises(SourceError, match=message) as caught:
        _export(source, tmp_path / "out")
    assert caught.value.retryable is False


def test_a_window_without_rows_or_a_table_without_snapshots_names_the_table_and_filter(
    lake_conn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = TimeWindow(datetime(2026, 4, 1, tzinfo=UTC), datetime(2026, 4, 2, tzinfo=UTC))
    with pytest.raises(
        SourceError,
        match=r"Iceberg table sales.card_transactions \(snapshot \d+, catalog lake\) has no rows in the "
        r"run's window \(event_time >= '2026-04-01T00:00:00\+00:00' AND event_time < '2026-04-02",
    ) as caught:
        _export(_source(), tmp_path, empty)
    assert caught.value.retryable is False
    # A table created but never written has no snapshot: nothing to count, nothing to export.
    iceberg_lake.table(tmp_path / "new", monkeypatch, conn_id="new")
    assert iceberg.rows_ready(_source(conn_id="new"), WINDOW, 1) == (
        False,
        "Iceberg table sales.card_transactions (snapshot None, catalog new) holds 0 row(s) in "
        "event_time >= '2026-03-02T00:00:00+00:00' AND event_time < '2026-03-05T00:00:00+00:00', fewer than 1",
    )
    with pytest.raises(SourceError, match=r"\(snapshot None, catalog new\) has no rows in the run's window"):
        _export(_source(conn_id="new"), tmp_path / "new-out")


def test_a_snapshot_expired_while_it_is_read_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The export loaded the table at a snapshot; before it read the files, a writer replaced the
    days and a maintenance job expired the snapshot and deleted its files."""
    busy = iceberg_lake.table(tmp_path / "busy", monkeypatch, conn_id="busy")
    iceberg_lake.write_days(busy, DAYS[1:4], 100)
    scan = iceberg.window_scan(_source(conn_id="busy"), WINDOW)
    iceberg_lake.write_days(busy, DAYS[1:4], 100, seed=5)
    assert iceberg_lake.expire_snapshots(busy)
    (tmp_path / "out").mkdir()
    with pytest.raises(
        SourceError,
        match=rf"reading Iceberg table sales.card_transactions \(snapshot {scan.snapshot_id}, catalog busy\): "
        "a file of the snapshot being read no longer exists",
    ) as caught:
        iceberg.export_scan(_source(conn_id="busy"), scan, tmp_path / "out")
    assert caught.value.retryable is False


def test_a_catalog_that_cannot_be_reached_is_retried_and_a_wrong_one_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.conftest import free_port

    rest = {"conn_type": "iceberg", "host": f"http://127.0.0.1:{free_port()}", "extra": {}}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_DOWN", json.dumps(rest))
    with pytest.raises(
        SourceUnavailable,
        match=r"opening the Iceberg catalog of Airflow connection 'lake_down': ConnectionError: .*Connection refused",
    ) as caught:
        iceberg.window_scan(_source(conn_id="lake_down"), WINDOW)
    assert caught.value.retryable is True
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_WRONG", json.dumps({"conn_type": "iceberg", "extra": {"type": "nope"}})
    )
    with pytest.raises(SourceError, match=r"Airflow connection 'lake_wrong': ValueError: .*nope") as caught:
        iceberg.window_scan(_source(conn_id="lake_wrong"), WINDOW)
    assert caught.value.retryable is False


def test_a_snapshot_records_the_snapshot_id_and_outlives_an_overwrite_and_the_expiry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    table = iceberg_lake.table(tmp_path / "lake", monkeypatch)
    iceberg_lake.write_days(table, DAYS, 400)
    snapshot_id = table.refresh().current_snapshot().snapshot_id
    config = load_config(iceberg_lake.iceberg_config(tmp_path, partitions=3, batch_rows=250, file_rows=500))
    before = snapshot_for_date(config, "2026-03-04")  # the window 03-02 .. 03-04
    assert before.rows == 3 * 400 and before.format == "parquet" and len(before.files) == 3
    assert before.source is not None
    assert (before.source.kind, before.source.conn_id, before.source.table, before.source.snapshot_id) == (
        "iceberg",
        "lake",
        "sales.card_transactions",
        snapshot_id,
    )
    assert before.source.filter == (
        "event_time >= '2026-03-02T00:00:00+00:00' AND event_time < '2026-03-05T00:00:00+00:00'"
    )
    assert before.source is not None
    assert (
        source_kind("iceberg").origin(before.source)
        == f"sales.card_transactions of catalog lake at snapshot {snapshot_id}"
    )
    assert lineage_tags(before) == {
        "trainpipe.data_source": "iceberg:lake/sales.card_transactions",
        "trainpipe.data_window": "2026-03-02T00:00:00+00:00 .. 2026-03-05T00:00:00+00:00",
        "trainpipe.data_snapshot_id": str(snapshot_id),
        "trainpipe.data_filter": before.source.filter,
    }
    assert snapshot_for_date(config, "2026-03-04") == before  # same snapshot, same rows: same manifest

    # A day is overwritten and the old snapshots expire, their files deleted: the snapshot the
    # manifest names can no longer be read at the source.
    iceberg_lake.write_days(table, [DAYS[2]], 400, seed=8)
    assert len(iceberg_lake.expire_snapshots(table)) == 1
    after = snapshot_for_date(config, "2026-03-04")
    assert after.digest != before.digest and after.source is not None
    assert after.source.snapshot_id == table.refresh().current_snapshot().snapshot_id != snapshot_id
    assert [s.snapshot_id for s in table.refresh().snapshots()] == [after.source.snapshot_id]
    # The earlier snapshot is what it was: its manifest verifies and its files hold the old rows.
    kept = load_manifest(config.data, before.digest)
    assert kept == before
    for f in kept.files:
        assert _sha(local_path(f.uri)) == f.sha256
    assert list(pq.read_table(local_path(kept.files[0].uri)).schema.names) == NAMES


def test_the_config_of_an_iceberg_source() -> None:
    base = {"uri": "x", "label": "is_fraud", "features": {"numeric": ["amount"]}}
    source = _source().model_dump()
    parsed = DataSection.model_validate({**base, "source": source})
    assert (parsed.wait.marker, parsed.wait.min_rows) == (None, 1)
    kept = DataSection.model_validate({**base, "source": source, "wait": {"min_rows": 500, "mode": "poke"}})
    assert (kept.wait.marker, kept.wait.min_rows, kept.wait.mode) == (None, 500, "poke")
    for data, message in (
        ({**base, "source": source, "format": "csv"}, "format: an iceberg source is exported as parquet"),
        (
            {**base, "source": source, "wait": {"marker": "_SUCCESS"}},
            "wait.marker: an iceberg source has no marker file",
        ),
        ({**base, "source": {**source, "order_by": []}}, "at least 1 item"),
        (
            {**base, "source": {**source, "columns": ["amount"]}},
            r"must include the order_by column\(s\) transaction_id",
        ),
        ({**base, "source": {**source, "columns": ["transaction_id", "a", "a"]}}, "lists a more than once"),
        ({**base, "source": {**source, "conn_id": ""}}, "at least 1 character"),
        ({**base, "source": {k: v for k, v in source.items() if k != "conn_id"}}, "conn_id"),
        ({**base, "source": {**source, "table": "card_transactions"}}, "table"),
        ({**base, "source": {**source, "table": "sales..t"}}, "table"),
    ):
        with pytest.raises(ValueError, match=message):
            DataSection.model_validate(data)


def test_a_refused_connection_on_a_port_with_403_in_it_is_asked_again() -> None:
    """A port or address holding the digits 403 is no HTTP 403: the suite's free port 40379 once
    made an unreachable catalog final instead of transient."""
    from airflow_trainpipe.data.sources.errors import SourceUnavailable
    from airflow_trainpipe.data.sources.iceberg import _classified

    down = ConnectionError("HTTPConnection(host='127.0.0.1', port=40379): Connection refused")
    assert isinstance(_classified(down, "lake", "opening"), SourceUnavailable)
    forbidden = OSError("403 Forbidden? no: status 403 from the catalog")
    assert not isinstance(_classified(forbidden, "lake", "opening"), SourceUnavailable)
    assert not isinstance(_classified(OSError("HTTP 403"), "lake", "opening"), SourceUnavailable)
