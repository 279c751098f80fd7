"""Validation of 1M rows x 20 columns: ~20 expectations + drift on every feature, each side in a
fresh process, vs plain Great Expectations running the same expectations on the same file.

Plain GX reads the Parquet file into pandas and validates the whole frame (its usual use);
trainpipe's DataValidateOperator path streams row-group batches (schema, volume, the same
expectations, drift profiles and scores against a reference snapshot), then writes the report
and the Data Docs page. Peak RSS is the process high-water mark; the data's in-memory size is
the Arrow table's bytes. RSS after imports is reported so the two can be compared net of the
libraries' own footprint.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROWS = 1_000_000
NUMERIC = [f"x{i:02d}" for i in range(17)]
CATEGORICAL = ["segment", "region"]
LABEL = "label"
REPEATS = 3
BATCH_ROWS = 524_288  # the default of validation.batch_rows

_WRITE = """
import sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
seed, path = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(seed)
columns = {f"x{i:02d}": rng.normal(i, 1 + i / 10, %(rows)d) for i in range(17)}
columns["segment"] = rng.choice(["a", "b", "c", "d", "e"], %(rows)d)
columns["region"] = rng.choice([f"r{i}" for i in range(20)], %(rows)d)
columns["label"] = rng.integers(0, 2, %(rows)d)
table = pa.table(columns)
pq.write_table(table, path, row_group_size=131072)
print(table.nbytes)
""" % {"rows": ROWS}

# Also the suite of the validation-engines section (validation_engines_bench.py).
EXPECTATIONS = (
    [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": c}} for c in NUMERIC[:9]]
    + [
        {
            "type": "expect_column_values_to_be_between",
            "kwargs": {"column": c, "min_value": -100, "max_value": 100},
        }
        for c in NUMERIC[:9]
    ]
    + [
        {
            "type": "expect_column_values_to_be_in_set",
            "kwargs": {"column": "segment", "value_set": list("abcde")},
        },
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": LABEL, "value_set": [0, 1]}},
    ]
)

# Peak RSS of the measured step alone: each side first runs once on a 1,000-row slice (so lazy
# imports and caches are loaded), then the kernel's high-water mark is reset (clear_refs 5).
_PEAK = """
def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])

def reset_peak():
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
"""

_PLAIN_GX = (
    _PEAK
    + """
import json, sys, time
import great_expectations as gx
import pyarrow.parquet as pq
from great_expectations.data_context.types.base import ProgressBarsConfig
from great_expectations.expectations.registry import get_expectation_impl

def validate(path):
    frame = pq.read_table(path).to_pandas()
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    asset = context.data_sources.add_pandas("bench").add_dataframe_asset("frame")
    suite = gx.ExpectationSuite(name="bench")
    for spec in json.loads(sys.argv[2]):
        suite.add_expectation(get_expectation_impl(spec["type"])(**spec["kwargs"]))
    return asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame}).validate(suite)

validate(sys.argv[3])  # the 1,000-row warm-up file
reset_peak()
base = rss_kb("VmRSS")
t0 = time.perf_counter()
result = validate(sys.argv[1])
elapsed = time.perf_counter() - t0
print(json.dumps({"seconds": elapsed, "success": bool(result.success), "base_kb": base, "peak_kb": rss_kb("VmHWM")}))
"""
)

_TRAINPIPE = (
    _PEAK
    + """
import json, sys, time
from airflow_trainpipe.config import parse_config
from airflow_trainpipe.data.snapshots.manifests import resolve_snapshot
from airflow_trainpipe.data.validation import history
from airflow_trainpipe.data.validation.validate import validate_snapshot, write_report
config = parse_config(sys.argv[1])
reference = history.previous(config.data, config.pipeline, "ds=2026-01-02")
warm = resolve_snapshot(config.data, "warmup")
validate_snapshot(config, "warmup", warm, reference=reference, previous=None)
manifest = resolve_snapshot(config.data, "ds=2026-01-02")
reset_peak()
base = rss_kb("VmRSS")
t0 = time.perf_counter()
report = validate_snapshot(config, "ds=2026-01-02", manifest, reference=reference, previous=reference)
write_report(report)
elapsed = time.perf_counter() - t0
print(json.dumps({"seconds": elapsed, "success": report.passed, "drift": len(report.drift_scores), "base_kb": base,
                  "peak_kb": rss_kb("VmHWM"), "checks": len(report.checks)}))
"""
)

_REFERENCE = """
import sys
from airflow_trainpipe.config import parse_config
from airflow_trainpipe.data.snapshots.manifests import resolve_snapshot
from airflow_trainpipe.data.validation import history
from airflow_trainpipe.data.validation.validate import history_payload, validate_snapshot
config = parse_config(sys.argv[1])
report = validate_snapshot(config, "ds=2026-01-01", resolve_snapshot(config.data, "ds=2026-01-01"), reference=None, previous=None)
assert report.passed, report.failure_table()
history.record(config.data, config.pipeline, "ds=2026-01-01", history_payload(report))
"""


def _config(root: Path) -> str:
    features = {"numeric": NUMERIC, "categorical": CATEGORICAL}
    return json.dumps(
        {
            "pipeline": "bench_validation",
            "owner": "bench",
            "schedule": {"cron": "0 2 * * *", "start_date": "2026-01-01"},
            "data": {"uri": root.as_uri(), "label": LABEL, "features": features},
            "validation": {
                "expectations": EXPECTATIONS,
                "volume": {"min_rows": 1, "max_change": 0.5},
                "batch_rows": BATCH_ROWS,
                "drift": {"numeric_method": "psi", "categorical_method": "chi2", "threshold": 0.2},
            },
            "training": {"model": "tabular_mlp", "task": "binary_classification"},
            "gate": {"metric": "roc_auc"},
        }
    )


def _run(code: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *args], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench_validation() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sizes = []
        for day, seed in (("2026-01-01", 1), ("2026-01-02", 2)):
            (root / f"ds={day}").mkdir()
            out = subprocess.run(
                [sys.executable, "-c", _WRITE, str(seed), str(root / f"ds={day}" / "part-00000.parquet")],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            sizes.append(int(out.strip()))
        (root / "warmup").mkdir()
        import pyarrow.parquet as pq

        pq.write_table(
            pq.read_table(root / "ds=2026-01-01" / "part-00000.parquet").slice(0, 1000),
            root / "warmup" / "part-00000.parquet",
        )
        config = _config(root)
        subprocess.run([sys.executable, "-c", _REFERENCE, config], check=True, capture_output=True)
        data_file = str(root / "ds=2026-01-02" / "part-00000.parquet")
        plain, ours = [], []
        for _ in range(REPEATS):  # interleaved, so both sides see the same machine load
            plain.append(
                _run(
                    _PLAIN_GX,
                    data_file,
                    json.dumps(EXPECTATIONS),
                    str(root / "warmup" / "part-00000.parquet"),
                )
            )
            ours.append(_run(_TRAINPIPE, config))
    assert all(r["success"] for r in plain) and all(r["success"] for r in ours)
    data_mb = sizes[1] / 2**20
    p_s, o_s = statistics.median(r["seconds"] for r in plain), statistics.median(r["seconds"] for r in ours)
    p_peak, o_peak = (statistics.median(r["peak_kb"] for r in rs) / 1024 for rs in (plain, ours))
    p_net, o_net = (
        statistics.median((r["peak_kb"] - r["base_kb"]) for r in rs) / 1024 for rs in (plain, ours)
    )
    return [
        "## Data validation (1M rows x 20 columns)",
        "",
        f"{ROWS:,} rows x 20 columns (17 float64, 2 string categoricals, 1 int64 label; {data_mb:.0f} MiB in memory as Arrow),",
        f"{len(EXPECTATIONS)} expectations (not_null, between, in_set); trainpipe also checks the schema, volume and the drift",
        f"of all {len(NUMERIC) + len(CATEGORICAL)} features (PSI numeric, chi2 categorical) against a 1M-row reference snapshot and writes",
        "report.json + Data Docs. Each side in a fresh process, interleaved, median of 3. Command: `make bench`.",
        "",
        f"Read one row group (131,072 rows) at a time; GX batches of {BATCH_ROWS:,} rows (`validation.batch_rows`). Peak RSS is measured for the validation step",
        "alone: each side first validates a 1,000-row slice (lazy imports, caches), then the kernel's high-water mark is reset.",
        "",
        "| | wall time | peak RSS | peak RSS above the RSS before the step |",
        "|---|---|---|---|",
        f"| plain GX (read Parquet to pandas, validate the frame) | {p_s:.2f} s | {p_peak:.0f} MiB | {p_net:.0f} MiB ({p_net / data_mb:.2f}x data) |",
        f"| trainpipe `validate_snapshot` (streamed, + schema/volume/drift/report) | {o_s:.2f} s | {o_peak:.0f} MiB | {o_net:.0f} MiB ({o_net / data_mb:.2f}x data) |",
        "",
        f"Time ratio trainpipe / plain GX: **{o_s / p_s:.2f}** (target <= 1.3). "
        f"Memory above baseline: **{o_net / data_mb:.2f}x** the data's in-memory size (target < 2x).",
        "",
    ]


if __name__ == "__main__":
    print("\n".join(bench_validation()))
