"""Validation engines: `stream`, `sql` (PostgreSQL) and `spark` (Spark Connect) side by side.

The same rows for every engine: 2M and 8M rows x 21 columns (an int64 `id`, 17 float64 normals,
2 string categoricals, an int64 label), written as Parquet files of 1,048,576 rows (row groups of
131,072; the export's file size) and bulk-loaded, in the same order, into a throwaway PostgreSQL
cluster (`tests/helpers/postgres.py`, the tests' own). One suite for every engine: the 20
expectations of the `validation` section (not_null, between, in_set; 1M rows there), plus the
schema, volume and drift of the 19 features (PSI numeric, chi2 categorical) against a 200k-row
reference partition of the same distribution. Each engine validates:

- stream: the Parquet files, read a row group at a time in the worker;
- sql: `SELECT * FROM bench_<rows>` in PostgreSQL (GX's SQL engine, the profiles in the database,
  a COUNT against the manifest), as `validate_data` does for a `sql` source;
- spark: the same Parquet files on a local Spark Connect server (`tests/helpers/spark_connect.py`:
  pyspark's spark-submit, `local[2]`, 2 GiB driver heap), the worker holding only the client.

Each validation runs in its own process (the worker side): the libraries are imported and the
connection looked up first, then the kernel's RSS high-water mark is reset (clear_refs 5) and
`validate_snapshot` is timed; peak RSS is the high-water mark after it. For spark the Connect
server's own high-water mark is reset and read around the run (a JVM: its heap grows to what it
was given and stays). The database and the server run on the same 2 cores as the worker.

`python benchmarks/validation_engines_bench.py` prints the section; `make bench
ONLY=validation_engines` writes it into BENCHMARKS.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from validation_bench import CATEGORICAL, EXPECTATIONS, LABEL, NUMERIC  # the same columns and suite

REPO = Path(__file__).resolve().parents[1]
SIZES = tuple(int(n) for n in os.environ.get("TRAINPIPE_BENCH_ENGINE_ROWS", "2000000,8000000").split(","))
REFERENCE_ROWS = 200_000
FILE_ROWS = 1_048_576
GROUP_ROWS = 131_072
ENGINES = ("stream", "sql", "spark")
CONN_ID = "bench_pg"
SERVER_MEMORY = "2g"


def _write(root: Path, partition: str, rows: int, seed: int) -> list[Path]:
    """One partition in files of FILE_ROWS rows, generated a file at a time."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / partition
    folder.mkdir(parents=True)
    paths = []
    for index, start in enumerate(range(0, rows, FILE_ROWS)):
        count = min(FILE_ROWS, rows - start)
        rng = np.random.default_rng([seed, index])
        columns = {"id": np.arange(start, start + count, dtype=np.int64)}
        columns |= {f"x{i:02d}": rng.normal(i, 1 + i / 10, count) for i in range(17)}
        columns["segment"] = rng.choice(list("abcde"), count)
        columns["region"] = rng.choice([f"r{i}" for i in range(20)], count)
        columns[LABEL] = rng.integers(0, 2, count)
        path = folder / f"part-{index:05d}.parquet"
        pq.write_table(pa.table(columns), path, row_group_size=GROUP_ROWS)
        paths.append(path)
    (folder / "_SUCCESS").write_text("")
    return paths


def _load(url: str, table: str, paths: list[Path]) -> None:
    """The partition's files into PostgreSQL in file order (COPY through ADBC's bulk ingest)."""
    import adbc_driver_postgresql.dbapi as adbc_pg
    import pyarrow.parquet as pq

    with adbc_pg.connect(url.replace("postgres://", "postgresql://", 1)) as db, db.cursor() as cursor:
        for path in paths:
            cursor.adbc_ingest(table, pq.read_table(path), mode="create_append")
        cursor.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (id)")
        db.commit()
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        db.execute(f"VACUUM ANALYZE {table}")


def _config(root: Path, engine: str, remote: str | None) -> str:
    data: dict = {
        "uri": root.as_uri(),
        "label": LABEL,
        "features": {"numeric": NUMERIC, "categorical": CATEGORICAL},
    }
    if engine == "sql":
        query = "SELECT * FROM bench"  # the child passes the table of its size as the run's query
        data["source"] = {"kind": "sql", "conn_id": CONN_ID, "query": query, "order_by": ["id"]}
    validation: dict = {
        "engine": engine,
        "expectations": EXPECTATIONS,
        "volume": {"min_rows": 1},
        "drift": {"numeric_method": "psi", "categorical_method": "chi2", "threshold": 0.2},
    }
    if remote is not None:
        validation["spark_remote"] = remote
    return json.dumps(
        {
            "pipeline": "bench_engines",
            "owner": "bench",
            "schedule": {"cron": "0 2 * * *", "start_date": "2026-01-01"},
            "data": data,
            "snapshots": {"uri": (root / "snapshots").as_uri()},
            "validation": validation,
            "training": {"model": "tabular_mlp", "task": "binary_classification"},
            "gate": {"metric": "roc_auc"},
        }
    )


def _child(engine: str, config_text: str, partition: str, reference_file: str, table: str) -> None:
    """One validation in this process; prints `ENGINES {json}`."""
    import great_expectations  # noqa: F401  (imported before the measured step, by every engine)
    import pandas  # noqa: F401

    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.data.snapshots.manifests import resolve_snapshot
    from airflow_trainpipe.data.validation.validate import validate_snapshot

    config = parse_config(config_text)
    query = None
    if engine == "sql":
        from airflow_trainpipe.data.validation.sql_engine import sqlalchemy_url

        sqlalchemy_url(CONN_ID)  # Airflow imported and its first connection lookup done
        query = f"SELECT * FROM {table}"
    if engine == "spark":
        import pyspark.sql.connect.session  # noqa: F401
    reference = json.loads(Path(reference_file).read_text())
    manifest = resolve_snapshot(config.data, partition)
    Path("/proc/self/clear_refs").write_text("5")
    base_kb = _status_kb("self", "VmRSS")
    started = time.perf_counter()
    report = validate_snapshot(config, partition, manifest, reference=reference, previous=None, query=query)
    seconds = time.perf_counter() - started
    result = {
        "rows": manifest.rows,
        "seconds": seconds,
        "base_kb": base_kb,
        "peak_kb": _status_kb("self", "VmHWM"),
        "passed": report.passed,
        "checks": len(report.checks),
        "failures": [c.message for c in report.failures][:5],
        "drift": report.drift_scores,
    }
    print("ENGINES " + json.dumps(result), flush=True)


def _status_kb(pid: str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reference(root: Path) -> Path:
    """The reference partition's validation record (the stream engine's profiles), as the
    history would hand it to validate_snapshot."""
    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.data.snapshots.manifests import resolve_snapshot
    from airflow_trainpipe.data.validation.validate import history_payload, validate_snapshot

    config = parse_config(_config(root, "stream", None))
    manifest = resolve_snapshot(config.data, "ds=reference")
    report = validate_snapshot(config, "ds=reference", manifest, reference=None, previous=None)
    assert report.passed, report.failure_table()
    path = root / "reference.json"
    path.write_text(json.dumps({**history_payload(report), "partition": "ds=reference"}))
    return path


def _run(
    engine: str,
    config: str,
    partition: str,
    table: str,
    reference: Path,
    env: dict[str, str],
    server_pid: int | None,
) -> dict:
    if server_pid is not None:
        Path(f"/proc/{server_pid}/clear_refs").write_text("5")
        server_before = _status_kb(str(server_pid), "VmRSS")
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            engine,
            config,
            partition,
            str(reference),
            table,
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0 or "ENGINES " not in done.stdout:
        raise RuntimeError(
            f"validation engines bench ({engine}, {partition}) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    result = json.loads(done.stdout.split("ENGINES ", 1)[1].splitlines()[0])
    result["process_s"] = time.perf_counter() - started
    if server_pid is not None:
        result["server_before_kb"] = server_before
        result["server_peak_kb"] = _status_kb(str(server_pid), "VmHWM")
    return result


def _partition(rows: int) -> str:
    return f"ds={_label(rows)}"


def _table(rows: int) -> str:
    return f"bench_{rows}"


def _label(rows: int) -> str:
    return f"{rows / 1e6:g}M"


def _measure(root: Path) -> tuple[dict[tuple[int, str], dict], dict[str, float]]:
    sys.path.insert(0, str(REPO))  # tests.helpers: the tests' PostgreSQL and Spark Connect server
    from tests.conftest import free_port
    from tests.helpers.postgres import PostgresServer
    from tests.helpers.spark_connect import SparkConnectServer

    setup: dict[str, float] = {}
    results: dict[tuple[int, str], dict] = {}
    started = time.perf_counter()
    _write(root, "ds=reference", REFERENCE_ROWS, seed=0)
    files = {rows: _write(root, _partition(rows), rows, seed=rows) for rows in SIZES}
    setup["write_s"] = time.perf_counter() - started
    reference = _reference(root)
    with PostgresServer(free_port()) as postgres, tempfile.TemporaryDirectory() as airflow_home:
        started = time.perf_counter()
        for rows in SIZES:
            _load(postgres.url, _table(rows), files[rows])
        setup["load_s"] = time.perf_counter() - started
        env = {
            **os.environ,
            "AIRFLOW_HOME": airflow_home,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            f"AIRFLOW_CONN_{CONN_ID.upper()}": postgres.url,
        }
        with SparkConnectServer(free_port(), memory=SERVER_MEMORY) as spark:
            setup["spark_start_s"] = spark.start_seconds
            assert spark.process is not None
            # A production server is long-running: its JVM has compiled Spark's hot code before a
            # run comes. One untimed validation of the reference warms this one up (the first run
            # on a fresh server took 48 s at 2M rows, the second 25 s).
            _run("spark", _config(root, "spark", spark.url), "ds=reference", "-", reference, env, None)
            for rows in SIZES:
                for engine in ENGINES:
                    remote = spark.url if engine == "spark" else None
                    pid = spark.process.pid if engine == "spark" else None
                    config = _config(root, engine, remote)
                    result = _run(engine, config, _partition(rows), _table(rows), reference, env, pid)
                    assert result["rows"] == rows and result["passed"], (engine, rows, result)
                    results[(rows, engine)] = result
                    print(
                        f"validation engines: {_label(rows)} {engine}: {result['seconds']:.1f} s, worker peak "
                        f"{result['peak_kb'] / 1024:.0f} MiB, load {os.getloadavg()[0]:.1f}",
                        file=sys.stderr,
                        flush=True,
                    )
    return results, setup


def bench_validation_engines() -> list[str]:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="trainpipe-engines-bench-") as tmp:
        results, setup = _measure(Path(tmp))
    load_after = os.getloadavg()[0]
    return _table_lines(results, setup, load_before, load_after)


def _table_lines(
    results: dict[tuple[int, str], dict], setup: dict[str, float], before: float, after: float
) -> list[str]:
    mib = 1024
    sizes = " and ".join(_label(rows) for rows in SIZES)
    lines = [
        "## Validation engines: stream, sql and spark on the same rows (issue 21)",
        "",
        f"{sizes} rows x 21 columns (int64 id, 17 float64, 2 string categoricals, int64 label), Parquet files of",
        "1,048,576 rows (row groups of 131,072) and the same rows in a throwaway PostgreSQL 15 table; the 20",
        "expectations of the section above, schema, volume and the drift of 19 features against a 200k-row",
        "reference. *stream*: the files in the worker, a row group at a time; *sql*: GX's SQL engine and the",
        "profiles in PostgreSQL (`SELECT * FROM bench_<rows>`, a COUNT against the manifest); *spark*: the same",
        f"files on a local Spark Connect server (pyspark 4.1.4's spark-submit, `local[2]`, {SERVER_MEMORY} driver heap),",
        "GX's Spark engine and the profiles as Spark aggregates; the server warmed up by one untimed validation",
        "of the reference first, as a long-running server is. Each validation once, in a fresh process",
        "(libraries imported and the connection looked up first; then the kernel's RSS high-water mark reset",
        "and `validate_snapshot` timed). *worker peak RSS*: that process's high-water mark; for spark the",
        "Connect server's (a JVM) high-water mark over the same run is given apart. PostgreSQL and the Spark",
        "server share the machine's 2 cores with the worker, and other workers loaded the machine",
        f"(1-minute load average {before:.1f} before, {after:.1f} after): wall times are stretched by that load.",
        "Command: `make bench ONLY=validation_engines`.",
        "",
        "| rows | engine | wall (s) | worker peak RSS (MiB) | worker RSS before (MiB) | Connect server peak RSS (MiB) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for rows in SIZES:
        for engine in ENGINES:
            r = results[(rows, engine)]
            server = f"{r['server_peak_kb'] / mib:,.0f}" if "server_peak_kb" in r else "-"
            lines.append(
                f"| {rows:,} | {engine} | {r['seconds']:.1f} | {r['peak_kb'] / mib:,.0f} | {r['base_kb'] / mib:,.0f} | {server} |"
            )
    lines.append("")
    if len(SIZES) > 1:
        small, large = SIZES[0], SIZES[-1]
        ratios = []
        for engine in ENGINES:
            ratio = results[(large, engine)]["peak_kb"] / results[(small, engine)]["peak_kb"]
            verdict = "met" if ratio <= 1.2 else "**missed**"
            ratios.append(f"{engine} **{ratio:.2f}x** ({verdict})")
        lines.append(
            f"- Worker peak RSS {_label(large)} / {_label(small)} (target <= 1.2x): "
            + ", ".join(ratios)
            + "."
        )
    lines.append(
        f"- Set-up, not in the table: writing the files {setup['write_s']:.0f} s, loading PostgreSQL "
        f"{setup['load_s']:.0f} s, starting the Connect server {setup['spark_start_s']:.1f} s."
    )
    return lines


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(*sys.argv[2:7])
    else:
        print("\n".join(bench_validation_engines()))
