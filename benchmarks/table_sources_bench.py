"""Sources: the `delta` and `iceberg` window exports to Parquet vs each library's own loop.

Each size is one table of 20 columns (the sql bench's layout: a bigint `id`, a timestamp `ts`,
8 float64, 5 int32, 5 string), `ROWS_PER_DAY` rows a day over as many days as the size needs,
written a day per commit in a shuffled day order (a backfill): a Delta table partitioned by a
`ds` date column (`deltalake.write_deltalake`), and an Iceberg table partitioned by `day(ts)` in
a SQL catalog on SQLite with a local warehouse (the day's Parquet file added with `add_files`,
as `trainpipe make-data --iceberg` does). The run's window holds every row. Sides:

- delta ours: `sources.delta.export` (open at the current version, the window filter on `ts`,
  the external sort by `id` in `file_rows` runs spilled and merged, row groups of exactly
  `batch_rows`, files of `file_rows`);
- delta raw: delta-rs's own loop: `DeltaTable(uri).to_pyarrow_dataset()`, its batches for the
  same filter, each `ParquetWriter.write_batch` into one file (no order, no re-cut);
- iceberg ours: `sources.iceberg.export` (the catalog from Airflow's Iceberg hook through an
  `AIRFLOW_CONN_*` connection, the current snapshot, one data file at a time, the same sort);
- iceberg raw: pyiceberg's own loop: the catalog loaded directly, `table.scan(row_filter=...,
  snapshot_id=...).to_arrow_batch_reader()`, each batch `ParquetWriter.write_batch`;
- iceberg raw+airflow: the same raw loop in a process that first imported Airflow and looked the
  connection up, as ours does (Airflow alone raises the RSS).

Each export runs in its own process, the sides alternately, `REPEATS` times (medians); timed from
opening the table to the last file closed; imports come before. Peak RSS: the process's VmHWM.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = (2_000_000, 8_000_000)
REPEATS = 2
ROWS_PER_DAY = 250_000
CONN_ID = "bench_lake"
TABLE = "bench.events"
START = date(2026, 1, 1)
SIDES = ("delta ours", "delta raw", "iceberg ours", "iceberg raw", "iceberg raw+airflow")
RAW_OF = {"delta ours": "delta raw", "iceberg ours": "iceberg raw"}


def day_rows(day: date, index: int) -> object:
    """One day's rows: ids `index * ROWS_PER_DAY ...`, `ts` spread over the day."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    i = np.arange(index * ROWS_PER_DAY, (index + 1) * ROWS_PER_DAY, dtype=np.int64)
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    micros = int(start.timestamp() * 1_000_000) + (np.arange(ROWS_PER_DAY) * (86_400_000_000 // ROWS_PER_DAY))
    text = pa.array(i).cast(pa.string())
    columns = {
        "id": i,
        "ts": pa.array(micros, pa.timestamp("us", tz="UTC")),
        **{f"f{k}": np.sin(i * (k + 1)).astype(np.float64) for k in range(8)},
        **{f"n{k}": ((i * (k + 7)) % (1000 + k)).astype(np.int32) for k in range(4)},
        "label": (i % 2).astype(np.int32),
        "s0": pc.binary_join_element_wise("segment_", pa.array(i % 5).cast(pa.string()), ""),
        "s1": pc.binary_join_element_wise("region_", pa.array(i % 50).cast(pa.string()), ""),
        "s2": pc.binary_join_element_wise("user_", text, ""),
        "s3": pc.utf8_lpad(text, 16, "0"),
        "s4": pc.utf8_lpad(pa.array(i % 10_000).cast(pa.string()), 5, "0"),
    }
    return pa.table(columns)


def _days(rows: int) -> list[date]:
    return [START + timedelta(days=d) for d in range(rows // ROWS_PER_DAY)]


def build(folder: Path, rows: int) -> None:
    """The Delta table `folder/delta` and the Iceberg catalog `folder/iceberg` of `rows` rows."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from airflow_trainpipe.examples.iceberg_table import open_catalog, replace_days

    days = _days(rows)
    order = list(enumerate(days))
    random.Random(rows).shuffle(order)
    catalog = open_catalog(folder / "iceberg", CONN_ID)
    catalog.create_namespace_if_not_exists("bench")
    schema = day_rows(days[0], 0).schema  # type: ignore[attr-defined]
    table = catalog.create_table(TABLE, schema=schema)
    from pyiceberg.transforms import DayTransform

    with table.update_spec() as spec:
        spec.add_field("ts", DayTransform(), "ts_day")
    table = catalog.load_table(TABLE)
    for index, day in order:
        rows_table = day_rows(day, index)
        with_ds = rows_table.append_column("ds", pa.array([day] * ROWS_PER_DAY, pa.date32()))  # type: ignore[attr-defined]
        write_deltalake(str(folder / "delta"), with_ds, partition_by=["ds"], mode="append")
        replace_days(table, {day: [rows_table]}, "ts")


def _window(rows: int) -> tuple[datetime, datetime]:
    days = _days(rows)
    start = datetime(days[0].year, days[0].month, days[0].day, tzinfo=UTC)
    return start, start + timedelta(days=len(days))


def _child(side: str, folder: str, rows_text: str, out_text: str) -> None:
    """One export in this process; prints `TABLES {json}`."""
    import pyarrow.parquet as pq

    from airflow_trainpipe.config.sources import DeltaSource, IcebergSource
    from airflow_trainpipe.data.sources.sql import airflow_connection
    from airflow_trainpipe.data.window import TimeWindow
    from airflow_trainpipe.examples.iceberg_table import catalog_properties, connection

    root, rows, out = Path(folder), int(rows_text), Path(out_text)
    window = TimeWindow(*_window(rows))
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = connection(root / "iceberg")
    names = ["id", "ts", *(f"f{k}" for k in range(8)), *(f"n{k}" for k in range(4)), "label"]
    fields = {"time_column": "ts", "order_by": ["id"], "columns": [*names, *(f"s{k}" for k in range(5))]}
    if side.startswith("delta"):
        import deltalake  # noqa: F401 - imported before the timed part

        from airflow_trainpipe.data.sources import delta
    else:
        import pyiceberg.catalog.sql
        import pyiceberg.io.pyarrow  # noqa: F401

        from airflow_trainpipe.data.sources import iceberg
    if side in ("iceberg ours", "iceberg raw+airflow"):
        from airflow.providers.apache.iceberg.hooks.iceberg import IcebergHook  # noqa: F401

        airflow_connection(CONN_ID)  # Airflow imported and its first connection lookup done
    base_kb = _status_kb("VmRSS")
    started, cpu = time.perf_counter(), _cpu_s()
    if side == "delta ours":
        source = DeltaSource(kind="delta", uri=(root / "delta").as_uri(), **fields)  # type: ignore[arg-type]
        done = sum(f.rows for f in delta.export(source, window, out).files)
    elif side == "iceberg ours":
        source = IcebergSource(kind="iceberg", conn_id=CONN_ID, table=TABLE, **fields)  # type: ignore[arg-type]
        done = sum(f.rows for f in iceberg.export(source, window, out).files)
    elif side == "delta raw":
        from deltalake import DeltaTable

        dataset = DeltaTable(str(root / "delta")).to_pyarrow_dataset()
        names = [n for n in dataset.schema.names if n != "ds"]
        field = dataset.schema.field("ts")
        batches = dataset.to_batches(columns=names, filter=delta.window_filter(field, window, "t"))
        done = _write(batches, out, pq)
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        table = SqlCatalog(CONN_ID, **catalog_properties(root / "iceberg")).load_table(TABLE)
        expression, _ = iceberg.window_filter(table.schema(), "ts", window, "t")
        snapshot = table.current_snapshot().snapshot_id
        done = _write(
            table.scan(row_filter=expression, snapshot_id=snapshot).to_arrow_batch_reader(), out, pq
        )
    seconds, cpu = time.perf_counter() - started, _cpu_s() - cpu
    peak_kb = _status_kb("VmHWM")
    files = sorted(out.glob("*.parquet"))
    result = {
        "rows": done,
        "seconds": seconds,
        "cpu_s": cpu,
        "peak_kb": peak_kb,
        "base_kb": base_kb,
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
    }
    print("TABLES " + json.dumps(result), flush=True)


def _write(batches: object, out: Path, pq: object) -> int:
    rows = 0
    writer = None
    try:
        for batch in batches:  # type: ignore[attr-defined]
            if writer is None:
                writer = pq.ParquetWriter(out / "part-00000.parquet", batch.schema)  # type: ignore[attr-defined]
            writer.write_batch(batch)
            rows += batch.num_rows
    finally:
        if writer is not None:
            writer.close()
    return rows


def _cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _status_kb(name: str) -> int:
    """A /proc/self/status figure in KiB: VmRSS now, VmHWM the peak. VmHWM is this process's own
    (its memory map's, reset by exec), unlike `ru_maxrss`, which a child started by fork + exec
    inherits from a larger parent: the parent here built the tables."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name):
            return int(line.split()[1])
    return 0


def _run(side: str, folder: Path, rows: int, home: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="trainpipe-tables-bench-", dir=home) as out:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", side, str(folder), str(rows), out],
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
                "AIRFLOW_HOME": home,
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "TRAINPIPE_HOME": home,
            },
        )
    if done.returncode != 0 or "TABLES " not in done.stdout:
        raise RuntimeError(
            f"table sources bench ({side}, {rows}) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout.split("TABLES ", 1)[1].splitlines()[0])


def _label(rows: int) -> str:
    return f"{rows / 1e6:g}M"


def measure(sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS) -> dict[int, dict[str, list[dict]]]:
    runs: dict[int, dict[str, list[dict]]] = {rows: {side: [] for side in SIDES} for rows in sizes}
    with tempfile.TemporaryDirectory(prefix="trainpipe-tables-") as scratch:
        for rows in sizes:
            folder = Path(scratch) / _label(rows)
            started = time.perf_counter()
            # In a process of its own: this one stays small, so the children it starts (and the
            # sql bench's, which read ru_maxrss) do not inherit a large peak.
            subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--build", str(folder), str(rows)],
                check=True,
                env={
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
                },
            )
            print(
                f"tables: built {_label(rows)} in {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        for _ in range(repeats):
            for rows in sizes:
                for side in SIDES:  # alternated, so all see the same machine load
                    result = _run(side, Path(scratch) / _label(rows), rows, scratch)
                    assert result["rows"] == rows, (side, rows, result)
                    runs[rows][side].append(result)
                    print(
                        f"tables: {_label(rows)} {side}: {result['seconds']:.2f} s, CPU {result['cpu_s']:.2f} s, "
                        f"peak RSS {result['peak_kb'] / 1024:.0f} MiB, load {os.getloadavg()[0]:.1f}",
                        file=sys.stderr,
                        flush=True,
                    )
    return runs


def bench_table_sources(sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS) -> list[str]:
    """The `### ` part of the Sources section: the table and its ratios."""
    from airflow_trainpipe.config.sources import DeltaSource

    defaults = DeltaSource(kind="delta", uri="x", time_column="ts", order_by=["id"])
    load_before = os.getloadavg()[0]
    runs = measure(sizes, repeats)
    load_after = os.getloadavg()[0]

    def med(rows: int, side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[rows][side])

    def rate(rows: int, side: str) -> float:
        return statistics.median(rows / r["seconds"] for r in runs[rows][side])

    lines = [
        "### Delta and Iceberg window exports vs each library's own loop",
        "",
        f"Tables of {' and '.join(_label(rows) for rows in sizes)} rows x 20 columns (the layout above: bigint `id`, a timestamp `ts`,",
        f"8 float64, 5 int32, 5 string), {ROWS_PER_DAY:,} rows a day, one commit a day in a shuffled day order: a Delta",
        "table partitioned by a `ds` date column, an Iceberg table partitioned by `day(ts)` in a SQL catalog on",
        "SQLite with a local warehouse. The window holds every row. *ours*: `sources.delta.export` /",
        "`sources.iceberg.export` (`time_column: ts`, `order_by: [id]`, batch_rows",
        f"{defaults.batch_rows:,}, file_rows {defaults.file_rows:,}: the external sort, runs spilled and merged, exact row",
        "groups and files; the iceberg catalog from Airflow's Iceberg hook). *raw*: the library's own loop into",
        "one Parquet file, no order: delta-rs `DeltaTable.to_pyarrow_dataset()` batches for the same filter;",
        "pyiceberg `table.scan(row_filter, snapshot_id).to_arrow_batch_reader()` on the catalog loaded directly.",
        "*iceberg raw+airflow*: that loop after importing Airflow and looking the connection up, as ours does.",
        f"Each export in its own process, the sides alternately, {repeats} times (medians); timed from opening the",
        "table to the last file closed; peak RSS: the process's VmHWM. Command: `make bench ONLY=sources`; the machine's",
        f"{os.cpu_count()} cores are shared with other workers: 1-minute load average {load_before:.1f} before and",
        f"{load_after:.1f} after, so the process's own CPU time is given beside the wall time.",
        "",
        "| rows | side | rows/s | wall (s) | CPU (s) | peak RSS (MiB) | RSS after imports (MiB) | files | Parquet bytes |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rows in sizes:
        for side in SIDES:
            last = runs[rows][side][-1]
            lines.append(
                f"| {rows:,} | {side} | {rate(rows, side):,.0f} | {med(rows, side, 'seconds'):.2f} "
                f"| {med(rows, side, 'cpu_s'):.2f} | {med(rows, side, 'peak_kb') / 1024:.0f} "
                f"| {med(rows, side, 'base_kb') / 1024:.0f} | {last['files']} | {last['bytes'] / 2**20:,.0f} MiB |"
            )
    lines.append("")
    for ours, raw in RAW_OF.items():
        ratios = ", ".join(f"{_label(rows)} **{rate(rows, ours) / rate(rows, raw):.2f}x**" for rows in sizes)
        cpu = ", ".join(
            f"{_label(rows)} {med(rows, ours, 'cpu_s') / med(rows, raw, 'cpu_s'):.2f}x" for rows in sizes
        )
        small, large = sizes[0], sizes[-1]
        growth = med(large, ours, "peak_kb") / med(small, ours, "peak_kb")
        raw_growth = med(large, raw, "peak_kb") / med(small, raw, "peak_kb")
        lines.append(
            f"- {ours.split()[0]}: rows/s ours / raw {ratios}; CPU ours / raw {cpu}; peak RSS "
            f"{_label(large)} / {_label(small)}: ours {growth:.2f}x, raw {raw_growth:.2f}x."
        )
    lines.append("")
    return lines


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        _child(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "--build":
        build(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        sizes = tuple(int(n) for n in sys.argv[1:]) or SIZES
        print("\n".join(bench_table_sources(sizes)))
