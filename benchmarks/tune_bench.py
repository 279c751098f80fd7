"""Tuning (issue 16): the example study's compute vs running every trial to the full budget.

`trainpipe tune dags/configs/fraud_detector_tuned.yaml` on one demo day (20,000 synthetic card
transactions, as `make demo` writes them): 16 trials, TPE, successive halving (rungs at 1 and 3
epochs, reduction factor 3), two one-process trials' worth of work run one after another here.
Then the same config with `pruning.kind: none` in a fresh home: every trial trains its 3 epochs.
Both run as a user runs them (the CLI, its last JSON line); device-hours are the jobs' own
(processes x training-loop time, every attempt), wall time is the whole command's.

`python benchmarks/tune_bench.py` prints the table; `make bench` writes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "dags" / "configs" / "fraud_detector_tuned.yaml"
BIN = Path(sys.executable).parent
DAY = "2026-01-02"


def _study(home: Path, config: Path) -> tuple[dict, float]:
    env = {**os.environ, "TRAINPIPE_HOME": str(home)}
    env.pop("MLFLOW_TRACKING_URI", None)
    subprocess.run(
        [str(BIN / "trainpipe"), "make-data", "--out", str(home / "data" / "card_transactions"),
         "--start", DAY, "--days", "1"],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(
        [str(BIN / "trainpipe"), "tune", str(config), "--ds", DAY], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"trainpipe tune failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), wall


def bench_tuning() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        unpruned = yaml.safe_load(CONFIG.read_text())
        unpruned["tuning"]["pruning"]["kind"] = "none"
        (root / "unpruned.yaml").write_text(yaml.safe_dump(unpruned))
        pruned, pruned_wall = _study(root / "pruned", CONFIG)
        full, full_wall = _study(root / "unpruned", root / "unpruned.yaml")
    ratio = pruned["compute_hours"] / full["compute_hours"]
    return [
        "## Tuning: successive halving vs every trial to the full budget (issue 16)",
        "",
        f"`trainpipe tune {CONFIG.relative_to(REPO)} --ds {DAY}` on one demo day (20,000 rows); then the",
        "same config with `pruning.kind: none` (each trial trains all 3 epochs). 16 trials, one process",
        "each, one after another; device-hours are the training jobs' own (every attempt, every rung).",
        "",
        "| study | trials | pruned | best roc_auc (validation) | baseline | device-hours | wall |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| TPE + successive halving | {pruned['trials']} | {pruned['pruned']} | {pruned['best']:.4f} | "
        f"{pruned['baseline']:.4f} | {pruned['compute_hours']:.5f} | {pruned_wall:.0f} s |",
        f"| TPE, no pruning | {full['trials']} | {full['pruned']} | {full['best']:.4f} | "
        f"{full['baseline']:.4f} | {full['compute_hours']:.5f} | {full_wall:.0f} s |",
        "",
        f"- device-hours with pruning / without: **{ratio:.2f}**; the pruned study's own estimate of every",
        f"  trial at the full budget (each trial's rate x 3 epochs): {pruned['full_budget_compute_hours']:.5f}",
        f"  (measured without pruning: {full['compute_hours']:.5f}).",
        f"- wall time with pruning / without: {pruned_wall / full_wall:.2f} (process start, fit and MLflow per",
        "  rung are not device-hours: a pruned trial still pays one job start).",
        "",
    ]


if __name__ == "__main__":
    print("\n".join(bench_tuning()))
