"""Tuning (issues 16 and 40): successive halving vs every trial at full budget, one trial after
another and two at a time; and a training job's start-up, before and after issue 40.

`trainpipe tune` on one demo day (20,000 synthetic card transactions, as `make demo` writes them),
and on one day of 600,000 rows
with the example study's 16 configurations: the example config with `sampler.kind: random` (each
slot draws the same values whatever the history, so both studies train the same 16
configurations), once with successive halving (rungs at 1 and 3 epochs, reduction factor 3) and
once with `pruning.kind: none`, each with `--max-parallel 1` and `--max-parallel 2` (one process
per trial). All run as a user runs them (the CLI, its last JSON line), each in a fresh home. Wall
time is the whole command's (snapshot, study, trials, the baseline job, MLflow); device-hours are
the jobs' own, start-up included; the estimate at full budget is the study's own.

Start-up: one training job of the example config (1 process, the same spec) started the way the
local launcher starts it (torchrun), timed from the launch to its `start` event (the line before
its first step), at this commit and at the commit before issue 40 (a git worktree, same
interpreter and packages), alternately; and this commit's phases from the job's own result.

`python benchmarks/tune_bench.py` prints the tables; `make bench ONLY=tuning` writes them.
"""

from __future__ import annotations

import json
import os
import statistics
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
BEFORE = "4480144"  # the last commit before issue 40: every rung its own job
STARTUP_REPEATS = 3
DEMO_ROWS = 20_000  # what `make demo` writes per day
LARGE_ROWS = 600_000  # a day where an epoch (~5.5 s here) is no longer small beside a job's start-up


def _make_day(home: Path, rows: int = DEMO_ROWS) -> None:
    env = {**os.environ, "TRAINPIPE_HOME": str(home)}
    subprocess.run(
        [str(BIN / "trainpipe"), "make-data", "--out", str(home / "data" / "card_transactions"),
         "--start", DAY, "--days", "1", "--rows", str(rows)],
        env=env, check=True, capture_output=True,
    )  # fmt: skip


def _study(home: Path, config: Path, parallel: int, rows: int) -> tuple[dict, float]:
    _make_day(home, rows)
    env = {**os.environ, "TRAINPIPE_HOME": str(home)}
    env.pop("MLFLOW_TRACKING_URI", None)
    started = time.perf_counter()
    done = subprocess.run(
        [str(BIN / "trainpipe"), "tune", str(config), "--ds", DAY, "--max-parallel", str(parallel)],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
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
        f"| {name} | {study['trials']} | {study['pruned']} | {study['best']:.4f} | "
        f"{study['compute_hours']:.5f} | {study['startup_compute_hours']:.5f} | "
        f"{study['full_budget_compute_hours']:.5f} | {wall:.0f} s |"
    )


def _studies(root: Path, rows: int) -> list[str]:
    halving_cfg = _variant(root, "halving", sampler={"kind": "random"})
    full_cfg = _variant(root, "full", sampler={"kind": "random"}, pruning={"kind": "none"})
    runs = {}
    for parallel in (1, 2):
        for kind, config in (("halving", halving_cfg), ("full", full_cfg)):
            runs[kind, parallel] = _study(root / f"{kind}{parallel}-{rows}", config, parallel, rows)
    lines = [
        f"**{rows:,} rows** on the day:",
        "",
        "| study | trials | pruned | best roc_auc (validation) | device-hours | of which start-up | "
        "estimate at full budget | wall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for parallel in (1, 2):
        for kind, label in (("halving", "successive halving"), ("full", "no pruning")):
            study, wall = runs[kind, parallel]
            lines.append(_row(f"random, {label}, max_parallel {parallel}", study, wall))
    lines.append("")
    for parallel in (1, 2):
        (halving, h_wall), (full, f_wall) = runs["halving", parallel], runs["full", parallel]
        measured = halving["compute_hours"] / full["compute_hours"]
        reported = halving["compute_hours"] / halving["full_budget_compute_hours"]
        lines += [
            f"- max_parallel {parallel}: wall time, successive halving / no pruning: **{h_wall / f_wall:.2f}**; "
            f"device-hours measured (halving / no pruning) **{measured:.2f}**, as the halving study "
            f"reported it (its device-hours / its estimate at full budget) **{reported:.2f}**.",
        ]
    return lines


def _spec_file(root: Path, home: Path) -> Path:
    """A plain training job of the example config, as `trainpipe train` builds it."""
    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.contracts.train_spec import TrainSpec

    files = sorted((home / "data" / "card_transactions" / f"ds={DAY}").glob("*.parquet"))
    config = load_config(str(CONFIG))
    spec = TrainSpec(config=config, run_id="startup", data_files=[f.as_uri() for f in files])
    path = root / "spec.json"
    path.write_text(spec.to_json())
    return path


def _first_step(source: Path, spec: Path, home: Path, run: int) -> tuple[float, dict]:
    """Seconds from torchrun's launch to the job's `start` event, and its start-up phases."""
    spec_json = json.loads(spec.read_text())
    spec_json["run_id"] = f"startup-{source.name}-{run}"  # a fresh run directory: nothing to resume
    # Sections added since BEFORE (canary, ...) are unset here; the older code forbids their keys.
    spec_json["config"] = {k: v for k, v in spec_json["config"].items() if v is not None}
    run_spec = spec.with_name(f"spec-{source.name}-{run}.json")
    run_spec.write_text(json.dumps(spec_json))
    env = {
        **os.environ,
        "TRAINPIPE_HOME": str(home),
        "PYTHONPATH": str(source / "src"),
        "DS_ACCELERATOR": "cpu",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--standalone",
               "-m", "airflow_trainpipe.runtime.train", "--spec", f"@{run_spec}"]  # fmt: skip
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first, phases = None, {}
    assert process.stdout is not None
    for line in process.stdout:
        if first is None and '"event": "start"' in line:
            first = time.perf_counter() - started
            phases = json.loads(line[line.index("{") :]).get("startup", {})
    if process.wait() != 0 or first is None:
        raise RuntimeError(f"the start-up job at {source} failed")
    return first, phases


def _startup(root: Path) -> list[str]:
    home = root / "startup-home"
    _make_day(home)
    spec = _spec_file(root, home)
    before = root / "before"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(before), BEFORE],
                   check=True, capture_output=True)  # fmt: skip
    try:
        times: dict[str, list[float]] = {"before": [], "after": []}
        phases: list[dict] = []
        for run in range(STARTUP_REPEATS):
            times["before"].append(_first_step(before, spec, home, run)[0])
            seconds, laps = _first_step(REPO, spec, home, run)
            times["after"].append(seconds)
            phases.append(laps)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], check=False)
    b, a = statistics.median(times["before"]), statistics.median(times["after"])
    names = list(phases[0])
    lines = [
        f"Launch to first step, one job (median of {STARTUP_REPEATS}, alternately): before issue 40 "
        f"({BEFORE}) **{b:.2f} s**, now **{a:.2f} s** (ratio {a / b:.2f}). Where it goes now (medians, s):",
        "",
        "| " + " | ".join(names) + " | total |",
        "|" + "---:|" * (len(names) + 1),
        "| "
        + " | ".join(f"{statistics.median(p[n] for p in phases):.2f}" for n in names)
        + f" | {statistics.median(sum(p.values()) for p in phases):.2f} |",
        "",
    ]
    return lines


def bench_tuning() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        startup = _startup(root)
        demo = _studies(root, DEMO_ROWS)
        large = _studies(root, LARGE_ROWS)
    return [
        "## Tuning: successive halving vs every trial at full budget, trials side by side, start-up (issues 16, 40)",
        "",
        f"`trainpipe tune` on one demo day ({DAY}, {DEMO_ROWS:,} rows) with the example study's 16 configurations",
        f"([{CONFIG.relative_to(REPO)}]({CONFIG.relative_to(REPO)}) with the random sampler: every study trains the same 16),",
        "successive halving (rungs at 1 and 3 epochs) vs no pruning, `--max-parallel 1` and `2` (one process per",
        "trial). Each trial is one training job through its rungs, forked from the study's warm parent (issue 40,",
        "launchers/forked.py). Device-hours are the jobs' own, start-up included (processes x wall time from the",
        "job's start to its result), plus the warm parent's start once; wall is the whole command.",
        f"The same on a day of {LARGE_ROWS:,} rows (`make-data --rows {LARGE_ROWS}`), where training is no longer",
        "small beside a job's start-up. Command: `make bench ONLY=tuning` (benchmarks/tune_bench.py).",
        "",
        *demo,
        "",
        *large,
        "",
        *startup,
    ]


if __name__ == "__main__":
    print("\n".join(bench_tuning()))
