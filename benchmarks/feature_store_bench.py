"""Feature store: historical retrieval of 1M entity rows x 20 features through Feast (DuckDB offline
store) vs a plain `pandas.merge_asof` of the same tables, and the first materialisation.

The repo: 4 feature views x 5 features (Int64 and Float64) over Parquet feature tables, each row
stamped at 00:00 UTC with `created` 3 h later, 10% of the rows dropped (so some entity rows have
no value inside the TTL and get nulls):

- `card_spend` and `card_behaviour`: 100,000 cards, a row a day for `DAYS` days, TTL 2 and 7 days;
- `merchant_stats`: 10,000 merchants, a row a day, TTL 3 days;
- `customer_profile`: 50,000 customers, a row a week, TTL 30 days.

The entity rows: `ROWS` rows (`row_id`, the three keys, `event_time`, `amount`, `label`), a day
at a time over the last `ENTITY_DAYS` days of the tables, in random order within a day, one
Parquet file. `feature_store.yaml` is the example's (`synthetic_features.FEATURE_STORE_YAML`:
DuckDB offline, SQLite online, file registry), applied with the Feast interpreter.

Sides, each in a process of its own started by a small wrapper that reads the peak RSS of its
child (`getrusage(RUSAGE_CHILDREN)`: `ru_maxrss`, and user + system CPU) and times it end to end:

- ours: `feature_store.client.retrieve` of the 20 references (the wrapper is the Airflow worker's
  side; the child the Feast interpreter: `import feast`, the registry, `get_historical_features`
  on the DuckDB offline store, the features appended to the entity rows in order, Parquet out);
- merge_asof: the main venv's pandas: the entity rows and the 4 tables read from Parquet, the
  entity rows sorted by time once, one `merge_asof` per view (`by` its key, backward, tolerance
  its TTL), re-sorted to entity order, Parquet out;
- materialise: `feature_store.client.materialize` of the 4 views into an empty SQLite online
  store (the registry and online.db restored to just after `feast apply` before each run);
- feast start: the Feast interpreter started with our child's environment, `from feast import
  FeatureStore` as the child imports it (typeguard's instrumentation skipped), exit: the fixed cost
  in each of ours and materialise; and the same with typeguard on (a plain `import feast`).

The sides run alternately, `REPEATS` times (medians). The two retrievals' outputs are compared
once (same rows in order, same values, nulls alike), so the ratio is between equal results.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = 1_000_000
DAYS = 31  # of feature history
ENTITY_DAYS = 28  # the entity rows' days: the last ones of the history
REPEATS = 3
START = datetime(2026, 1, 1, tzinfo=UTC)
MISSING = 0.10
# view -> (join key, entities, days between rows, TTL days, features (name, Int64?))
VIEWS: dict[str, tuple[str, int, int, int, tuple[tuple[str, bool], ...]]] = {
    "card_spend": (
        "card_id",
        100_000,
        1,
        2,
        (
            ("txn_count_1d", True),
            ("amount_sum_1d", False),
            ("amount_max_1d", False),
            ("declines_1d", True),
            ("online_share_1d", False),
        ),
    ),
    "card_behaviour": (
        "card_id",
        100_000,
        1,
        7,
        (
            ("txn_count_7d", True),
            ("amount_mean_7d", False),
            ("night_share_7d", False),
            ("countries_7d", True),
            ("velocity_7d", False),
        ),
    ),
    "merchant_stats": (
        "merchant_id",
        10_000,
        1,
        3,
        (
            ("m_txn_count_1d", True),
            ("m_amount_mean_1d", False),
            ("m_chargeback_rate", False),
            ("m_refunds_1d", True),
            ("m_risk_score", False),
        ),
    ),
    "customer_profile": (
        "customer_id",
        50_000,
        7,
        30,
        (
            ("tenure_days", True),
            ("cards_held", True),
            ("income_band", True),
            ("credit_score", False),
            ("avg_balance", False),
        ),
    ),
}
KEYS = ("card_id", "merchant_id", "customer_id")
REFS = [f"{view}:{name}" for view, spec in VIEWS.items() for name, _ in spec[4]]
SIDES = ("ours", "merge_asof", "materialise", "feast start", "feast start, typeguard on")


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p),
    }


def feature_table(view: str, seed: int = 0) -> object:
    import numpy as np
    import pyarrow as pa

    key, entities, step, _, features = VIEWS[view]
    rng = np.random.default_rng([seed, len(view), sum(map(ord, view))])
    stamps = np.array(
        [(START + timedelta(days=d)).replace(tzinfo=None) for d in range(0, DAYS, step)],
        dtype="datetime64[us]",
    )
    n = len(stamps) * entities
    ids = np.tile(np.arange(entities, dtype=np.int64), len(stamps))
    times = np.repeat(stamps, entities)
    level = rng.random(entities)[ids]  # each entity's own level, the same every day
    columns: dict[str, object] = {
        key: ids,
        "event_timestamp": pa.array(times, pa.timestamp("us", tz="UTC")),
        "created": pa.array(times + np.timedelta64(3, "h"), pa.timestamp("us", tz="UTC")),
    }
    for i, (name, integer) in enumerate(features):
        if integer:
            columns[name] = rng.poisson(1 + 20 * level * (i + 1)).astype(np.int64)
        else:
            columns[name] = np.round(rng.lognormal(2 + level, 0.5, n), 4)
    table = pa.table(columns)
    return table.filter(pa.array(rng.random(n) >= MISSING))


def entity_rows(rows: int = ROWS, seed: int = 0) -> object:
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng([seed, 99])
    first = DAYS - ENTITY_DAYS
    day = np.sort(rng.integers(first, DAYS, rows))
    micros = (day * 86_400 + rng.integers(0, 86_400, rows)) * 1_000_000 + int(START.timestamp() * 1e6)
    return pa.table(
        {
            "row_id": np.arange(rows, dtype=np.int64),
            "card_id": rng.integers(0, VIEWS["card_spend"][1], rows),
            "merchant_id": rng.integers(0, VIEWS["merchant_stats"][1], rows),
            "customer_id": rng.integers(0, VIEWS["customer_profile"][1], rows),
            "event_time": pa.array(micros, pa.timestamp("us", tz="UTC")),
            "amount": np.round(rng.lognormal(3.5, 1.0, rows), 2),
            "label": (rng.random(rows) < 0.03).astype(np.int64),
        }
    )


FEATURES_PY = '''\
"""Written by benchmarks/feature_store_bench.py."""

from datetime import timedelta

from feast import Entity, FeatureView, Field, FileSource, ValueType
from feast.types import Float64, Int64

{body}
'''


def features_py(folder: Path) -> str:
    body = []
    for key in KEYS:
        body.append(
            f"{key[:-3]} = Entity(name={key[:-3]!r}, join_keys=[{key!r}], value_type=ValueType.INT64)"
        )
    for view, (key, _, _, ttl, features) in VIEWS.items():
        fields = ", ".join(f"Field(name={n!r}, dtype={'Int64' if i else 'Float64'})" for n, i in features)
        body.append(
            f"{view} = FeatureView(name={view!r}, entities=[{key[:-3]}], ttl=timedelta(days={ttl}), "
            f"schema=[{fields}], source=FileSource(name={view + '_source'!r}, "
            f"path={str(folder / 'features' / (view + '.parquet'))!r}, timestamp_field='event_timestamp', "
            "created_timestamp_column='created'))"
        )
    return FEATURES_PY.format(body="\n\n".join(body))


def build(folder: Path) -> None:
    """The tables, the entity rows and the applied repo under `folder`; `repo/*.db` also saved as
    `pristine/` (just after apply) to restore before each materialisation."""
    import pyarrow.parquet as pq

    from airflow_trainpipe.data.feature_store.client import apply
    from airflow_trainpipe.examples.feast_repo import FEATURE_STORE_YAML

    folder = folder.resolve()
    (folder / "features").mkdir(parents=True)
    for view in VIEWS:
        pq.write_table(feature_table(view), folder / "features" / f"{view}.parquet")  # type: ignore[arg-type]
    pq.write_table(entity_rows(), folder / "entities.parquet")  # type: ignore[arg-type]
    repo = folder / "repo"
    repo.mkdir()
    (repo / "feature_store.yaml").write_text(FEATURE_STORE_YAML.format(project="trainpipe_bench", repo=repo))
    (repo / "features.py").write_text(features_py(folder))
    apply(python=None, repo=repo)
    (folder / "pristine").mkdir()
    for db in repo.glob("*.db"):
        shutil.copy2(db, folder / "pristine" / db.name)


MERGE_ASOF = """
import sys, time
t0 = time.perf_counter()
import pandas as pd
import pyarrow.parquet as pq
views = {views}
folder, out = sys.argv[1], sys.argv[2]
t1 = time.perf_counter()
entities = pq.read_table(folder + "/entities.parquet").to_pandas()
joined = entities.assign(_row=range(len(entities))).sort_values("event_time", kind="stable")
for view, (key, ttl, names) in views.items():
    right = pq.read_table(folder + "/features/" + view + ".parquet", columns=[key, "event_timestamp", *names])
    right = right.to_pandas().sort_values("event_timestamp", kind="stable")
    joined = pd.merge_asof(joined, right, left_on="event_time", right_on="event_timestamp", by=key,
                           direction="backward", tolerance=pd.Timedelta(days=ttl)).drop(columns="event_timestamp")
joined = joined.sort_values("_row").drop(columns="_row").reset_index(drop=True)
joined.to_parquet(out, index=False)
print("INNER", time.perf_counter() - t1, t1 - t0)
"""


def _child(side: str, folder_text: str, out_text: str) -> None:
    """The wrapper: one side in a child process; prints `FEATURES {json}`."""
    folder = Path(folder_text)
    own_kb = _status_kb("VmRSS")
    started = time.perf_counter()
    inner = None
    if side == "ours":
        from airflow_trainpipe.data.feature_store import client

        got = client.retrieve(
            python=None,
            repo=folder / "repo",
            entity_files=[folder / "entities.parquet"],
            timestamp_column="event_time",
            output=Path(out_text),
            features=REFS,
        )
        rows = got.rows
    elif side == "merge_asof":
        views = {v: (s[0], s[3], [n for n, _ in s[4]]) for v, s in VIEWS.items()}
        done = subprocess.run(
            [sys.executable, "-c", MERGE_ASOF.format(views=repr(views)), str(folder), out_text],
            check=True,
            capture_output=True,
            text=True,
        )
        inner = float(done.stdout.split("INNER ", 1)[1].split()[0])
        import pyarrow.parquet as pq

        rows = pq.read_metadata(out_text).num_rows
    elif side.startswith("feast start"):
        from airflow_trainpipe.data.feature_store import client

        # As the child starts (child.main skips typeguard's instrumentation before Feast is
        # imported), and as a plain `import feast` does, beside it.
        start = "" if side.endswith("typeguard on") else "child.skip_typeguard_instrumentation(); "
        code = (
            f"from airflow_trainpipe.data.feature_store import child; {start}from feast import FeatureStore"
        )
        argv = [client.feast_python(), "-c", code]
        subprocess.run(argv, check=True, env=client.feast_env())
        rows = 0
    else:
        from airflow_trainpipe.data.feature_store import client

        for db in (folder / "pristine").glob("*.db"):
            shutil.copy2(db, folder / "repo" / db.name)
        started = time.perf_counter()
        result = client.materialize(
            python=None,
            repo=folder / "repo",
            feature_views=list(VIEWS),
            end=START + timedelta(days=DAYS),
            cover_from=START + timedelta(days=DAYS - ENTITY_DAYS),
        )
        inner = float(result["seconds"])
        rows = _online_rows(folder / "repo" / "online.db")
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_kb, cpu_s = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    print(
        "FEATURES "
        + json.dumps(
            {
                "seconds": seconds,
                "cpu_s": cpu_s,
                "inner": inner,
                "peak_kb": peak_kb,
                "own_kb": own_kb,
                "rows": rows,
            }
        ),
        flush=True,
    )


def _online_rows(db: Path) -> int:
    """Entities in the online store (distinct keys per view's table), summed over the views."""
    import sqlite3

    with sqlite3.connect(db) as con:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return sum(con.execute(f'SELECT COUNT(DISTINCT entity_key) FROM "{t}"').fetchone()[0] for t in tables)


def _status_kb(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name):
            return int(line.split()[1])
    return 0


def _run(side: str, folder: Path, out: Path) -> dict:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", side, str(folder), str(out)],
        capture_output=True,
        text=True,
        env=_env(),
    )
    if done.returncode != 0 or "FEATURES " not in done.stdout:
        raise RuntimeError(
            f"feature store bench ({side}) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout.split("FEATURES ", 1)[1].splitlines()[0])


def compare(ours: Path, theirs: Path) -> str:
    """The two retrievals' outputs: equal rows in order, equal values and nulls (or what differs)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    a, b = pq.read_table(ours), pq.read_table(theirs)
    if a.num_rows != b.num_rows or not a["row_id"].equals(b["row_id"]):
        return f"rows differ: {a.num_rows} vs {b.num_rows}"
    differ, nulls = [], 0
    for ref in REFS:
        name = ref.split(":", 1)[1]
        x, y = a[name].cast("float64"), b[name].cast("float64")
        nulls += x.null_count
        same_null = pc.all(pc.equal(pc.is_null(x), pc.is_null(y))).as_py()
        same = pc.all(pc.fill_null(pc.equal(x, y), True)).as_py()
        if not (same_null and same):
            differ.append(name)
    if differ:
        return f"values differ in {', '.join(differ)}"
    return f"equal: {a.num_rows:,} rows in order, 20 features, {nulls:,} nulls (past the TTL) alike"


def measure(repeats: int = REPEATS) -> tuple[dict[str, list[dict]], str, float]:
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="trainpipe-features-") as scratch:
        folder = Path(scratch) / "bench"
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--build", str(folder)], check=True, env=_env()
        )
        built = time.perf_counter() - started
        print(f"features: built in {built:.0f} s", file=sys.stderr, flush=True)
        outputs = {side: Path(scratch) / f"{side}.parquet" for side in SIDES}
        verdict = ""
        for _ in range(repeats):
            for side in SIDES:  # alternated, so all see the same machine load
                result = _run(side, folder, outputs[side])
                runs[side].append(result)
                print(
                    f"features: {side}: {result['seconds']:.1f} s, peak RSS {result['peak_kb'] / 1024:.0f} MiB, "
                    f"rows {result['rows']:,}, load {os.getloadavg()[0]:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
            if not verdict:
                verdict = compare(outputs["ours"], outputs["merge_asof"])
                print(f"features: {verdict}", file=sys.stderr, flush=True)
    return runs, verdict, built


def bench_feature_store(repeats: int = REPEATS) -> list[str]:
    load_before = os.getloadavg()[0]
    runs, verdict, built = measure(repeats)
    load_after = os.getloadavg()[0]

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    views = [
        f"- `{view}`: 5 features by `{key}`, {entities:,} entities x a row "
        f"{'a day' if step == 1 else 'a week'} ({len(range(0, DAYS, step)) * entities * (1 - MISSING) / 1e6:.1f}M "
        f"rows), TTL {ttl} days"
        for view, (key, entities, step, ttl, _) in VIEWS.items()
    ]
    views = [f"{line}{';' if i < len(views) - 1 else '.'}" for i, line in enumerate(views)]
    lines = [
        f"## Feature store: historical retrieval of {ROWS / 1e6:g}M entity rows x {len(REFS)} features (Feast)",
        "",
        f"A Feast 0.67 repo (DuckDB offline store, SQLite online store, file registry) of {len(VIEWS)} feature",
        f"views over Parquet tables of {DAYS} days ({MISSING:.0%} of the rows dropped, so some entity rows have",
        "no value inside a TTL), written and applied by `benchmarks/feature_store_bench.py`:",
        "",
        *views,
        "",
        f"The entity rows: {ROWS:,} (`row_id`, the 3 keys, `event_time` over the last {ENTITY_DAYS} days, `amount`,",
        "`label`) in one Parquet file. Sides:",
        "",
        "- *ours*: `feature_store.client.retrieve` of the 20 references: the Feast child (`import feast`,",
        "  `get_historical_features`, the features appended to the entity rows in their order, Parquet out);",
        "- *merge_asof*: the main venv's pandas on the same files: read, the entity rows sorted by time, one",
        "  `pandas.merge_asof` per view (`by` its key, backward, tolerance its TTL), re-sorted to entity order,",
        "  Parquet out (its Int64 features come out as float64 with NaN, ours keep Int64 with nulls);",
        "- *materialise*: `client.materialize` of the 4 views into an empty SQLite online store (the first",
        "  load: from the entity rows' first day minus each view's TTL to the tables' end);",
        "- *feast start*: the Feast interpreter, with the child's environment, importing `FeatureStore` as the",
        "  child does (typeguard's instrumentation of Feast's classes skipped) and exiting: the fixed cost inside",
        "  each of ours and materialise; *typeguard on*: the same with the instrumentation, as before 2026-11-29.",
        "",
        f"The two retrievals' outputs, compared: {verdict}.",
        "",
        "Each side a process of its own, the sides",
        f"alternately, {repeats} times (medians); *wall*: from its start to its exit (interpreter start and",
        "imports included); *in-process*: merge_asof's read + join + write, materialise's own timer; *CPU*:",
        "user + system of the process (all its threads). Peak RSS: `ru_maxrss` of that process, read by a small",
        f"wrapper that started it (the wrapper's own {med('ours', 'own_kb') / 1024:.0f} MiB is a floor: a child inherits it through",
        f"fork). Command: `make bench ONLY=feature_store`. The machine's {os.cpu_count()} cores are shared with",
        f"other workers: 1-minute load average {load_before:.1f} before and {load_after:.1f} after,",
        "so wall times stretch; the CPU times less so. Building the tables and `feast apply` (not timed",
        f"below) took {built:.0f} s.",
        "",
        "| side | wall (s) | in-process (s) | CPU (s) | peak RSS (MiB) | wall per repeat (s) | result |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    results = {
        "ours": f"{runs['ours'][-1]['rows']:,} rows x 20 features",
        "merge_asof": f"{runs['merge_asof'][-1]['rows']:,} rows x 20 features",
        "materialise": f"{runs['materialise'][-1]['rows']:,} entity keys online (4 views)",
        "feast start": "",
        "feast start, typeguard on": "",
    }
    for side in SIDES:
        inner = "" if runs[side][0]["inner"] is None else f"{med(side, 'inner'):.1f}"
        each = ", ".join(f"{r['seconds']:.1f}" for r in runs[side])
        lines.append(
            f"| {side} | {med(side, 'seconds'):.1f} | {inner} | {med(side, 'cpu_s'):.1f} "
            f"| {med(side, 'peak_kb') / 1024:,.0f} | {each} | {results[side]} |"
        )

    def ratio(key: str) -> float:
        return med("ours", key) / med("merge_asof", key)

    per_repeat = ", ".join(
        f"{a['seconds'] / b['seconds']:.2f}" for a, b in zip(runs["ours"], runs["merge_asof"], strict=True)
    )
    less_start = (med("ours", "seconds") - med("feast start", "seconds")) / med("merge_asof", "seconds")
    lines += [
        "",
        f"- retrieval, ours / merge_asof: wall time **{ratio('seconds'):.2f}x** (per repeat {per_repeat}), "
        f"CPU {ratio('cpu_s'):.2f}x, peak RSS **{ratio('peak_kb'):.2f}x**; ours less the Feast start / "
        f"merge_asof: {less_start:.2f}x wall.",
        f"- the Feast start as the child does it / with typeguard's instrumentation: wall "
        f"**{med('feast start', 'seconds') / med('feast start, typeguard on', 'seconds'):.2f}x**, CPU "
        f"{med('feast start', 'cpu_s') / med('feast start, typeguard on', 'cpu_s'):.2f}x.",
        f"- materialisation of the 4 views (first load): **{med('materialise', 'seconds'):.1f} s** wall, "
        f"{med('materialise', 'inner'):.1f} s in Feast's `materialize` calls, "
        f"peak RSS {med('materialise', 'peak_kb') / 1024:,.0f} MiB.",
        "",
    ]
    return lines


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(*sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "--build":
        build(Path(sys.argv[2]))
    else:
        print("\n".join(bench_feature_store(int(sys.argv[1]) if len(sys.argv) > 1 else REPEATS)))
