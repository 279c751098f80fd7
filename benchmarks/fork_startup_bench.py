"""Start-up of a training job: under torchrun (cold) vs forked from a warm parent (issue 40).

Issue 40's wall-time target needs a trial's fixed cost (start-up + end) at most 1.5 epochs (see
docs/tuning.md); a cold job's start-up is mostly library imports that every job pays again. This
measures what a parent that imported them once (torch, deepspeed, mlflow, optuna, torch._dynamo,
the runtime) saves when each job is a fork of it: the same spec (fraud_detector.yaml on one
synthetic day), a new run id per job, alternately cold (LocalLauncher: torchrun, one rank, as the
train task and `trainpipe tune` start a job) and forked (RANK/WORLD_SIZE/MASTER_* set as torchrun
sets them, then `runtime.train.main`), 3 of each; medians. It is a measurement, not a launcher:
no code path of the package forks jobs.

`python benchmarks/fork_startup_bench.py` prints the section; `make bench ONLY=fork_startup` writes it.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = 20_000
ROUNDS = 3


def _measure(work: Path) -> list[dict]:
    """Runs in a process of its own (it forks): one record per job."""
    import yaml

    os.environ["TRAINPIPE_HOME"] = str(work / "home")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.examples.synthetic import write_day
    from airflow_trainpipe.launchers.local import LocalLauncher

    files = write_day((work / "data").as_uri(), date(2026, 1, 3), ROWS, seed=3)
    config = yaml.safe_load((REPO / "dags" / "configs" / "fraud_detector.yaml").read_text())
    config["training"]["checkpoint"]["uri"] = (work / "checkpoints").as_uri()
    base = TrainSpec(config=parse_config(yaml.safe_dump(config)), run_id="base", data_files=files)

    def cold(run_id: str) -> None:
        launcher = LocalLauncher(base.model_copy(update={"run_id": run_id}), 1)
        launcher.start()
        for _ in launcher.lines():
            pass
        assert launcher.wait() == 0, run_id

    t0 = time.perf_counter()
    import deepspeed  # noqa: F401
    import mlflow  # noqa: F401
    import optuna  # noqa: F401
    import torch._dynamo  # noqa: F401

    import airflow_trainpipe.runtime.train as runtime_train

    imports_s = time.perf_counter() - t0

    def forked(run_id: str) -> None:
        spec = work / f"{run_id}.json"
        spec.write_text(base.model_copy(update={"run_id": run_id}).to_json())
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        log = work / f"{run_id}.log"
        pid = os.fork()
        if pid == 0:  # the job: this process's imports, nothing else shared
            os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
            out = os.open(log, os.O_WRONLY | os.O_CREAT)
            os.dup2(out, 1)
            os.dup2(out, 2)
            code = 1
            try:
                code = runtime_train.main(["--spec", f"@{spec}"])
            finally:
                os._exit(code or 0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, log.read_text()[-3000:]

    records = []
    for round_number in range(ROUNDS):
        for kind, run in (("torchrun", cold), ("forked", forked)):
            run_id = f"{kind}{round_number}"
            t0 = time.perf_counter()
            run(run_id)
            wall = time.perf_counter() - t0
            (result,) = [p for p in work.rglob("result.json") if f"/{run_id}/" in str(p)]
            timing = json.loads(result.read_text())["timing"]
            records.append({"kind": kind, "wall_s": wall, "imports_s": imports_s, **timing})
    return records


def bench_fork_startup() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, __file__, "--measure", tmp], capture_output=True, text=True, timeout=900
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-4000:])
        records = json.loads(done.stdout.strip().splitlines()[-1])

    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in records if r["kind"] == kind)

    def phases(kind: str) -> str:
        names = sorted({n for r in records if r["kind"] == kind for n in r["startup"]})
        values = {
            n: statistics.median(r["startup"].get(n, 0.0) for r in records if r["kind"] == kind)
            for n in names
        }
        return ", ".join(f"{n} {v:.2f}" for n, v in values.items() if v >= 0.05)

    cold_wall, fork_wall = median("torchrun", "wall_s"), median("forked", "wall_s")
    return [
        "## Start-up of a training job: under torchrun vs forked from a warm parent (issue 40)",
        "",
        f"One rank, fraud_detector.yaml on one synthetic day of {ROWS:,} rows, a new run each job, "
        f"alternately, {ROUNDS} of each (medians). Launch to exit: under torchrun **{cold_wall:.2f} s**, "
        f"forked **{fork_wall:.2f} s** (ratio {fork_wall / cold_wall:.2f}); start-up to the first step "
        f"{median('torchrun', 'startup_s'):.2f} s vs {median('forked', 'startup_s'):.2f} s; the loop "
        f"{median('torchrun', 'loop_s'):.2f} s vs {median('forked', 'loop_s'):.2f} s; after the last step "
        f"{median('torchrun', 'end_s'):.2f} s vs {median('forked', 'end_s'):.2f} s. The parent's imports took "
        f"{records[0]['imports_s']:.2f} s, once.",
        "",
        f"Start-up phases (s), under torchrun: {phases('torchrun')}; forked: {phases('forked')}.",
        "",
        "Not a launcher: nothing in the package forks jobs. It sizes the lever issue 40 still needs "
        "(a trial's fixed cost at most 1.5 epochs for a wall ratio of 0.75; docs/tuning.md).",
        "",
        "Command: `make bench ONLY=fork_startup` (benchmarks/fork_startup_bench.py).",
        "",
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(_measure(Path(sys.argv[2]))))
    else:
        print("\n".join(bench_fork_startup()))
