"""Tuning (issue 16): the example study, and successive halving's compute vs every trial at full budget.

`trainpipe tune dags/configs/fraud_detector_tuned.yaml` on one demo day (20,000 synthetic card
transactions, as `make demo` writes them): 16 trials, TPE, successive halving (rungs at 1 and 3
epochs, reduction factor 3), the trials one after another. Then the compute comparison on the same
16 configurations: with the random sampler each slot draws the same values whatever the history, so
the same config with `sampler.kind: random` runs once with successive halving and once with
`pruning.kind: none` (every trial trains its 3 epochs). All run as a user runs them (the CLI, its
last JSON line), each in a fresh home; device-hours are the jobs' own (processes x training-loop
time, every attempt of every rung), wall time is the whole command's.

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


def _variant(root: Path, name: str, **tuning: dict) -> Path:
    config = yaml.safe_load(CONFIG.read_text())
    for key, value in tuning.items():
        config["tuning"][key].update(value)
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _row(name: str, study: dict, wall: float) -> str:
    return (
        f"| {name} | {study['trials']} | {study['pruned']} | {study['best']:.4f} | {study['baseline']:.4f} | "
        f"{study['compute_hours']:.5f} | {study['full_budget_compute_hours']:.5f} | {wall:.0f} s |"
    )


def bench_tuning() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        example, example_wall = _study(root / "example", CONFIG)
        halving, halving_wall = _study(
            root / "halving", _variant(root, "halving", sampler={"kind": "random"})
        )
        full, full_wall = _study(
            root / "full", _variant(root, "full", sampler={"kind": "random"}, pruning={"kind": "none"})
        )
    return [
        "## Tuning: the example study; successive halving vs every trial at full budget (issue 16)",
        "",
        f"`trainpipe tune {CONFIG.relative_to(REPO)} --ds {DAY}` on one demo day (20,000 rows), 16",
        "trials of one process each, one after another. Then the same 16 configurations (random sampler:",
        "a slot draws the same values whatever the history) with successive halving and without pruning.",
        "Device-hours are the training jobs' own (every attempt, every rung); the estimate is each trial's",
        "own device-hours per epoch times the full budget.",
        "",
        "| study | trials | pruned | best roc_auc (validation) | baseline | device-hours | estimate at full budget | wall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        _row("example: TPE + successive halving", example, example_wall),
        _row("random + successive halving", halving, halving_wall),
        _row("random, no pruning (same 16 trials)", full, full_wall),
        "",
        f"- example study: {example['pruned']} of {example['trials']} trials stopped at the first rung; best "
        f"{example['best']:.4f} vs the config's own hyperparameters {example['baseline']:.4f} (same split).",
        f"- device-hours, successive halving / every trial at full budget (same trials, measured): "
        f"**{halving['compute_hours'] / full['compute_hours']:.2f}**; the halving study's own estimate of the",
        f"  full budget was {halving['full_budget_compute_hours']:.5f} vs {full['compute_hours']:.5f} measured.",
        f"- wall time, same comparison: {halving_wall / full_wall:.2f} (process start, fit and MLflow per rung are",
        "  not device-hours: a pruned trial still pays one job start).",
        "",
    ]


if __name__ == "__main__":
    print("\n".join(bench_tuning()))
