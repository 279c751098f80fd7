"""Start-up of a training job: under torchrun (cold) vs forked from a warm parent (issue 40).

Issue 40's wall-time target needs a trial's fixed cost (start-up + end) at most 1.5 epochs (see
docs/tuning.md); a cold job's start-up is mostly library imports that every job pays again. This
measures what the warm parent (launchers/forked.py: torch, deepspeed, mlflow, optuna,
torch._dynamo, DeepSpeed's Muon module, MLflow's SQL stores and pyfunc and the runtime imported
once) saves when each job is a fork of it: the same spec
(fraud_detector.yaml on one synthetic day), a new run id per job, alternately cold
(LocalLauncher: the torchrun command, as the train task starts a job) and forked (ForkedLauncher:
torchrun's agent forked from the warm parent, which forks the ranks, as `trainpipe tune` starts a
CPU trial), on one rank and on two, 3 of each; medians.

`python benchmarks/fork_startup_bench.py` prints the section; `make bench ONLY=fork_startup` writes it.
"""

from __future__ import annotations

import json
import os
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
NPROCS = (1, 2)


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

    def cold(run_id: str, nproc: int) -> None:
        launcher = LocalLauncher(base.model_copy(update={"run_id": run_id}), nproc)
        launcher.start()
        for _ in launcher.lines():
            pass
        assert launcher.wait() == 0, run_id

    from airflow_trainpipe.launchers.forked import ForkedLauncher, warm_parent
    from airflow_trainpipe.launchers.local import job_environment

    imports_s = warm_parent(job_environment(0, 1))

    def forked(run_id: str, nproc: int) -> None:
        launcher = ForkedLauncher(base.model_copy(update={"run_id": run_id}), nproc)
        launcher.start()
        for _ in launcher.lines():
            pass
        assert launcher.wait() == 0, run_id

    records = []
    for round_number in range(ROUNDS):
        for nproc in NPROCS:
            for kind, run in (("torchrun", cold), ("forked", forked)):
                run_id = f"{kind}{nproc}r{round_number}"
                t0 = time.perf_counter()
                run(run_id, nproc)
                wall = time.perf_counter() - t0
                (result,) = [p for p in work.rglob("result.json") if f"/{run_id}/" in str(p)]
                timing = json.loads(result.read_text())["timing"]
                records.append(
                    {"kind": kind, "nproc": nproc, "wall_s": wall, "imports_s": imports_s, **timing}
                )
    return records


def bench_fork_startup() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, __file__, "--measure", tmp], capture_output=True, text=True, timeout=900
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-4000:])
        records = json.loads(done.stdout.strip().splitlines()[-1])

    def of(kind: str, nproc: int) -> list[dict]:
        return [r for r in records if r["kind"] == kind and r["nproc"] == nproc]

    def median(kind: str, nproc: int, key: str) -> float:
        return statistics.median(r[key] for r in of(kind, nproc))

    def phases(kind: str, nproc: int) -> str:
        names = sorted({n for r in of(kind, nproc) for n in r["startup"]})
        values = {n: statistics.median(r["startup"].get(n, 0.0) for r in of(kind, nproc)) for n in names}
        return ", ".join(f"{n} {v:.2f}" for n, v in values.items() if v >= 0.05)

    rows = []
    for nproc in NPROCS:
        cold_wall, fork_wall = median("torchrun", nproc, "wall_s"), median("forked", nproc, "wall_s")
        rows.append(
            f"| {nproc} | {cold_wall:.2f} | {fork_wall:.2f} | **{fork_wall / cold_wall:.2f}** | "
            f"{median('torchrun', nproc, 'startup_s'):.2f} / {median('forked', nproc, 'startup_s'):.2f} | "
            f"{median('torchrun', nproc, 'loop_s'):.2f} / {median('forked', nproc, 'loop_s'):.2f} | "
            f"{median('torchrun', nproc, 'end_s'):.2f} / {median('forked', nproc, 'end_s'):.2f} |"
        )
    return [
        "## Start-up of a training job: under torchrun vs forked from a warm parent (issue 40)",
        "",
        f"fraud_detector.yaml on one synthetic day of {ROWS:,} rows, a new run each job, alternately "
        f"under the torchrun command and forked, {ROUNDS} of each per world size (medians, seconds). "
        f"The parent's imports took {records[0]['imports_s']:.2f} s, once (its interpreter, the "
        "imports and a first fork).",
        "",
        "| ranks | torchrun: launch to exit | forked: launch to exit | forked / torchrun | start-up to the first step | the loop | after the last step |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        *(
            f"Start-up phases (s), {nproc} rank(s), under torchrun: {phases('torchrun', nproc)}; "
            f"forked: {phases('forked', nproc)}."
            for nproc in NPROCS
        ),
        "",
        "A forked job runs torchrun's own agent (`elastic_launch`, `--standalone`'s rendezvous) in a "
        "fork of the warm parent, and the agent forks the ranks (launchers/forked.py): its "
        "`torchrun` phase is the agent's rendezvous, not an interpreter's start. `trainpipe tune` "
        "forks its CPU trials this way, and so do the suite's jobs whose subject is not the launch; "
        "the train task starts the torchrun command (a task process runs one job: there is nothing "
        "to share). Issue 40's wall ratio of 0.75 needs a trial's fixed cost at most 1.5 epochs "
        "(docs/tuning.md).",
        "",
        "Command: `make bench ONLY=fork_startup` (benchmarks/fork_startup_bench.py).",
        "",
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(_measure(Path(sys.argv[2]))))
    else:
        print("\n".join(bench_fork_startup()))
