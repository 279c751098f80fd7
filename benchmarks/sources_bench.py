"""Sources: the `sql` source's streamed, ordered export to Parquet vs ADBC's own loop; then the
`delta` and `iceberg` window exports vs delta-rs's and pyiceberg's own loops
(`table_sources_bench.py`, appended to the same section).

A throwaway PostgreSQL cluster (`tests/helpers/postgres.py`, the tests' own) holds two tables
of 2M and 8M rows x 20 columns, built inside PostgreSQL with generate_series: a bigint `id`
(primary key, the ordering key), a timestamp, 8 float8, 5 int4 and 5 text columns. Each table is
exported by:

- ours: `airflow_trainpipe.data.sources.sql.export` of a `sql` source (`order_by: [id]`, the default
  batch_rows and file_rows) on an Airflow connection given as `AIRFLOW_CONN_<ID>`: ADBC batches,
  the tie check on the key, re-cut into row groups of exactly batch_rows rows and files of
  file_rows rows;
- raw: ADBC's own loop on the identical query text (`SELECT * FROM (q) AS trainpipe_source ORDER
  BY "id"`): `cursor.fetch_record_batch()`, each batch `ParquetWriter.write_batch` into one file;
- raw+airflow: the same raw loop in a process that first imported Airflow and looked the
  connection up, as ours does (and any Airflow task has): Airflow alone raises the peak RSS.

Each export runs in its own process, the sides alternately, REPEATS times (medians). The timed
part is from connecting to the last file closed (imports, and the first lookup of the Airflow
connection, come before it). Peak RSS is the process's VmHWM at the end: its own memory map's
peak. `ru_maxrss`, read before, is inherited through fork + exec from the parent when the parent
was larger: it reported the ~290 MiB of `benchmarks/run.py` for every export.

`python benchmarks/sources_bench.py` prints the section; `make bench` writes it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = (2_000_000, 8_000_000)
REPEATS = 3
CONN_ID = "bench_pg"
QUERY = "SELECT * FROM {table}"
# raw+airflow: the raw loop in a process that has imported Airflow and looked the connection up
# first, as ours has (and as any Airflow task has): Airflow's import alone raises the peak RSS.
SIDES = ("ours", "raw", "raw+airflow")

_TABLE = """
CREATE UNLOGGED TABLE {table} AS SELECT
  i AS id,
  timestamp '2026-01-01' + i * interval '1 second' AS ts,
  (i % 997)::float8 / 997 AS f0, sin(i)::float8 AS f1, cos(i)::float8 AS f2, (i * 0.5)::float8 AS f3,
  ((i * 7919) % 100003)::float8 AS f4, ln(i + 1)::float8 AS f5, sqrt(i)::float8 AS f6, (i % 13)::float8 AS f7,
  (i % 1000)::int4 AS n0, (i % 7)::int4 AS n1, ((i * 31) % 65536)::int4 AS n2, (i / 1000)::int4 AS n3,
  (i % 2)::int4 AS label,
  'segment_' || (i % 5) AS s0, 'region_' || (i % 50) AS s1, 'user_' || i AS s2, md5(i::text) AS s3,
  to_char(i % 10000, 'FM00000') AS s4
FROM generate_series(1::bigint, {rows}) AS i
"""


def _child(side: str, url: str, table: str, folder: str) -> None:
    """One export in this process; prints `SOURCES {json}`."""
    import time

    import adbc_driver_postgresql.dbapi as adbc_pg  # ~0.3 s; ours imports it in `connect`: not timed
    import pyarrow.parquet as pq

    from airflow_trainpipe.config.sources import SqlSource
    from airflow_trainpipe.data.sources.sql import airflow_connection, export, ordered

    query = QUERY.format(table=table)
    out = Path(folder)
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = url
    if side != "raw":
        airflow_connection(CONN_ID)  # Airflow imported and its first connection lookup done
    if side == "ours":
        source = SqlSource(kind="sql", conn_id=CONN_ID, query=query, order_by=["id"])
        base_kb = _status_kb("VmRSS")
        started, cpu = time.perf_counter(), _cpu_s()
        files, _ = export(source, query, out)
        seconds, cpu = time.perf_counter() - started, _cpu_s() - cpu
        rows = sum(f.rows for f in files)
    else:
        uri = url.replace("postgres://", "postgresql://", 1)
        base_kb = _status_kb("VmRSS")
        started, cpu = time.perf_counter(), _cpu_s()
        rows = 0
        with adbc_pg.connect(uri) as db, db.cursor() as cursor:
            cursor.execute(ordered(query, ["id"]))
            reader = cursor.fetch_record_batch()
            with pq.ParquetWriter(out / "part-00000.parquet", reader.schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
                    rows += batch.num_rows
        seconds, cpu = time.perf_counter() - started, _cpu_s() - cpu
    peak_kb = _status_kb("VmHWM")
    groups = [pq.ParquetFile(p).metadata for p in sorted(out.glob("*.parquet"))]
    group_rows = [m.row_group(i).num_rows for m in groups for i in range(m.num_row_groups)]
    result = {
        "rows": rows,
        "seconds": seconds,
        "cpu_s": cpu,
        "peak_kb": peak_kb,
        "base_kb": base_kb,
        "files": len(groups),
        "groups": len(group_rows),
        "largest_group": max(group_rows),
        "bytes": sum(p.stat().st_size for p in out.glob("*.parquet")),
    }
    print("SOURCES " + json.dumps(result), flush=True)


def _cpu_s() -> float:
    """This process's CPU time (user + system): unlike wall time, not stretched by other load."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _status_kb(name: str) -> int:
    """A /proc/self/status figure in KiB: VmRSS now, VmHWM the peak of this process's own memory."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name):
            return int(line.split()[1])
    return 0


def _run(side: str, url: str, table: str, airflow_home: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="trainpipe-sources-bench-") as folder:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", side, url, table, folder],
            capture_output=True,
            text=True,
            env={**os.environ, "AIRFLOW_HOME": airflow_home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"},
        )
    if done.returncode != 0 or "SOURCES " not in done.stdout:
        raise RuntimeError(
            f"sources bench ({side}, {table}) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout.split("SOURCES ", 1)[1].splitlines()[0])


def _build(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        for rows in SIZES:
            table = _table(rows)
            db.execute(_TABLE.format(table=table, rows=rows))
            db.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (id)")
            db.execute(f"VACUUM ANALYZE {table}")


def _label(rows: int) -> str:
    return f"{rows / 1e6:g}M"


def _table(rows: int) -> str:
    return f"bench_{rows}"


def _measure() -> dict[int, dict[str, list[dict]]]:
    sys.path.insert(0, str(REPO))  # tests.helpers: the tests' throwaway PostgreSQL
    from tests.conftest import free_port
    from tests.helpers.postgres import PostgresServer

    runs: dict[int, dict[str, list[dict]]] = {rows: {side: [] for side in SIDES} for rows in SIZES}
    with PostgresServer(free_port()) as server, tempfile.TemporaryDirectory() as airflow_home:
        _build(server.url)
        for _ in range(REPEATS):
            for rows in SIZES:
                for side in SIDES:  # alternated, so all see the same machine load
                    result = _run(side, server.url, _table(rows), airflow_home)
                    assert result["rows"] == rows, (side, rows, result)
                    runs[rows][side].append(result)
                    print(
                        f"sources: {_label(rows)} {side}: {result['seconds']:.2f} s, CPU {result['cpu_s']:.2f} s, "
                        f"peak RSS {result['peak_kb'] / 1024:.0f} MiB, load {os.getloadavg()[0]:.1f}",
                        file=sys.stderr,
                        flush=True,
                    )
    return runs


def bench_sources() -> list[str]:
    from airflow_trainpipe.config.sources import SqlSource

    defaults = SqlSource(kind="sql", conn_id="x", query="SELECT 1", order_by=["id"])
    load_before = os.getloadavg()[0]
    runs = _measure()
    load_after = os.getloadavg()[0]

    def med(rows: int, side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[rows][side])

    def rate(rows: int, side: str) -> float:
        return statistics.median(rows / r["seconds"] for r in runs[rows][side])

    lines = [
        "## Sources: SQL, Delta and Iceberg exports to Parquet vs each library's own loop",
        "",
        "### SQL export vs ADBC's own loop (PostgreSQL)",
        "",
        "A throwaway PostgreSQL 15 cluster on 127.0.0.1 (`tests/helpers/postgres.py`, fsync off) holds tables of",
        f"{' and '.join(_label(rows) for rows in SIZES)} rows x 20 columns built with generate_series: bigint `id` (primary key), a timestamp, 8 float8,",
        "5 int4, 5 text. *ours*: `sources.sql.export` of a `sql` source (`order_by: [id]`; batch_rows",
        f"{defaults.batch_rows:,}, file_rows {defaults.file_rows:,}, the defaults) on an Airflow connection",
        "(`AIRFLOW_CONN_*`): ADBC batches, the tie check, row groups of exactly batch_rows rows, files of",
        "file_rows rows. *raw*: ADBC's own loop on the identical query text (`SELECT * FROM (q) AS trainpipe_source",
        'ORDER BY "id"`): `cursor.fetch_record_batch()`, each batch `ParquetWriter.write_batch` into one file.',
        "*raw+airflow*: the same raw loop in a process that first imported Airflow and looked the connection up,",
        "as ours does (any Airflow task has Airflow loaded). All write snappy Parquet (pyarrow's default) to local",
        f"disk. Each export in its own process, the sides alternately, {REPEATS} times (medians); timed from connecting",
        "to the last file closed; imports come before, the ADBC driver's too (~0.3 s, which `export` would",
        "otherwise pay once per process). Peak RSS: the process's VmHWM (`ru_maxrss` would report the parent's",
        "larger peak, inherited through fork + exec); *after imports*: its RSS just",
        "before the timed part. The database runs on the same machine: its backend takes one of the",
        f"{os.cpu_count()} cores. Command: `make bench ONLY=sources`. 1-minute load average {load_before:.1f} before",
        f"and {load_after:.1f} after the measurement: wall times stretch with other load, so the client process's",
        "own CPU time (user + system, timed part) is given too.",
        "",
        "| rows | side | rows/s | wall (s) | client CPU (s) | peak RSS (MiB) | RSS after imports (MiB) | files / row groups (largest) | Parquet bytes |",
        "|---:|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for rows in SIZES:
        for side in SIDES:
            last = runs[rows][side][-1]
            lines.append(
                f"| {rows:,} | {side} | {rate(rows, side):,.0f} | {med(rows, side, 'seconds'):.2f} "
                f"| {med(rows, side, 'cpu_s'):.2f} "
                f"| {med(rows, side, 'peak_kb') / 1024:.0f} | {med(rows, side, 'base_kb') / 1024:.0f} "
                f"| {last['files']} / {last['groups']} ({last['largest_group']:,}) | {last['bytes'] / 2**20:,.0f} MiB |"
            )
    small, large = SIZES

    def paired(rows: int) -> str:
        pairs = zip(runs[rows]["ours"], runs[rows]["raw"], strict=True)
        return ", ".join(f"{raw['seconds'] / ours['seconds']:.2f}" for ours, raw in pairs)

    ratios = ", ".join(
        f"{_label(rows)} **{rate(rows, 'ours') / rate(rows, 'raw'):.2f}x** (per repeat {paired(rows)})"
        for rows in SIZES
    )
    vs_airflow = ", ".join(
        f"{_label(rows)} {rate(rows, 'ours') / rate(rows, 'raw+airflow'):.2f}x" for rows in SIZES
    )
    cpu = ", ".join(
        f"{_label(rows)} {med(rows, 'ours', 'cpu_s') / med(rows, 'raw', 'cpu_s'):.2f}x" for rows in SIZES
    )
    ours_rss = med(large, "ours", "peak_kb") / med(small, "ours", "peak_kb")
    raw_rss = med(large, "raw", "peak_kb") / med(small, "raw", "peak_kb")
    lines += [
        "",
        f"- rows/s, ours / raw ADBC: {ratios} (target >= 0.9x); ours / raw+airflow: {vs_airflow}.",
        f"- client CPU time, ours / raw ADBC: {cpu} (ours adds the tie check and the re-cut into row groups).",
        f"- peak RSS of ours, {_label(large)} / {_label(small)} rows: **{ours_rss:.2f}x** (target <= 1.2x: flat); raw: {raw_rss:.2f}x.",
        "",
    ]
    from table_sources_bench import bench_table_sources  # benchmarks/ is on sys.path (run.py, this file)

    return lines + bench_table_sources()


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        _child(*sys.argv[2:])
    else:
        print("\n".join(bench_sources()))
