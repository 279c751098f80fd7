"""Real training jobs for the tests: torchrun's agent, DeepSpeed on gloo, MLflow on SQLite."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.launchers.local import Line, LocalLauncher
from tests.conftest import EXAMPLE_CONFIGS

EVERY_STEPS = (
    10  # checkpoint interval of the test job: 19 steps per epoch (+ epoch-end checkpoints), 2 epochs
)


@dataclass
class JobRun:
    code: int
    losses: dict[int, float] = field(default_factory=dict)
    start: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    output: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.output)


def job_config(checkpoint_root: Path, zero_stage: int = 1, preemption_grace: float | None = None):
    return parse_config(job_config_text(checkpoint_root, zero_stage, preemption_grace))


def job_config_text(checkpoint_root: Path, zero_stage: int = 1, preemption_grace: float | None = None) -> str:
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    for old, new in (
        ("uri: checkpoints", f"uri: {checkpoint_root.as_uri()}"),
        ("every_steps: 100", f"every_steps: {EVERY_STEPS}"),
        ("batch_size: 256", "batch_size: 24"),  # global batch 48 splits over 1, 2 and 3 ranks
        ("epochs: 3", "epochs: 2"),
        ("early_stopping_patience: 2", "early_stopping_patience: 5"),
        ("dropout: 0.1", "dropout: 0.0"),  # dropout masks depend on the rank layout
        ("zero_stage: 1", f"zero_stage: {zero_stage}"),
        # 914 of the 1200 rows train (247 holdout, 39 validation): 19 steps of 48 per epoch, so the
        # epoch-end checkpoint (step 19) is not one of the every-10-steps ones, which the resume
        # tests rely on. (The default validation share, 0.1, would leave 870 rows: 18 steps.)
        ("    seed: 7\n", "    seed: 6\n"),
        (
            "    key_column: transaction_id\n",
            "    key_column: transaction_id\n  validation: {fraction: 0.05}\n",
        ),
    ):
        assert old in text, old
        text = text.replace(old, new)
    if preemption_grace is not None:
        interval = f"every_steps: {EVERY_STEPS}\n"
        text = text.replace(interval, f"{interval}    preemption_grace: {preemption_grace}\n")
    return text


def make_spec(
    checkpoint_root: Path,
    files: list[str],
    run_id: str,
    zero_stage: int = 1,
    preemption_grace: float | None = None,
) -> TrainSpec:
    config = job_config(checkpoint_root, zero_stage, preemption_grace)
    return TrainSpec(config=config, run_id=run_id, data_files=files)


_uninterrupted: dict[int, JobRun] = {}


def uninterrupted_run(
    tmp_path_factory: pytest.TempPathFactory, files: list[str], zero_stage: int = 1
) -> JobRun:
    """The reference run of `make_spec(..., files, zero_stage)`, trained once per session: the
    resume tests compare against it and the serving test loads its model. Call it with the
    session's `trainpipe_home` fixture active (every job logs to that one MLflow database)."""
    if zero_stage not in _uninterrupted:
        run = run_job(
            make_spec(
                tmp_path_factory.mktemp(f"uninterrupted_zero{zero_stage}"), files, "uninterrupted", zero_stage
            )
        )
        assert run.code == 0, run.text[-3000:]
        _uninterrupted[zero_stage] = run
    return _uninterrupted[zero_stage]


KILLS = ("step:13", "mid_step:22", "save:30")


@dataclass
class Interrupted:
    """The stage-1 run `killed` after its three tries, each ended by a kill -9 at one of KILLS."""

    reference: JobRun
    tries: list[JobRun]
    run_dir: Path  # as try 3 left it: complete checkpoints 10, 19 and 20; step 30 without marker
    files: list[str]
    finished: tuple[JobRun, str] | None = None

    def resume(
        self,
        root: Path,
        nproc: int = 2,
        before: Callable[[Path], None] | None = None,
        env: dict[str, str] | None = None,
        files: list[str] | None = None,
    ) -> tuple[JobRun, str]:
        """Run try 4 on a copy of the run directory under `root`, as a fresh MLflow run: (the run,
        its run directory). `files`: the data try 4 reads (None: the run's own)."""
        import shutil

        from airflow_trainpipe.core.storage import local_path
        from airflow_trainpipe.runtime.tracking import RUN_ID_FILE

        spec = make_spec(root, self.files if files is None else files, "killed")
        copy = local_path(spec.run_dir)
        shutil.copytree(self.run_dir, copy)
        (copy / RUN_ID_FILE).unlink()
        if before is not None:
            before(copy)
        return run_job(spec, nproc=nproc, env=env), spec.run_dir


_interrupted: list[Interrupted] = []


def interrupted_run(tmp_path_factory: pytest.TempPathFactory, files: list[str]) -> Interrupted:
    """`make_spec(..., files, "killed")` on 2 ranks, killed -9 at each of KILLS in turn (each try
    resuming the last), once per session, and its reference (`uninterrupted_run`). Every try runs
    under TRAINPIPE_CHECK_COLLECTIVES=nccl, said here in so many words (tests/conftest.py sets it
    for every job): the collectives test reads them too. Call it with `trainpipe_home` active."""
    import shutil

    from airflow_trainpipe.core.storage import local_path
    from airflow_trainpipe.runtime.collectives import CHECK_ENV

    if not _interrupted:
        reference = uninterrupted_run(tmp_path_factory, files, zero_stage=1)
        spec = make_spec(tmp_path_factory.mktemp("interrupted"), files, "killed")
        tries = [run_job(spec, pause_at=kill_at, env={CHECK_ENV: "nccl"}) for kill_at in KILLS]
        for run in tries:
            assert run.code != 0 and run.result is None, run.text[-3000:]
        snapshot = tmp_path_factory.mktemp("interrupted_snapshot") / "killed"
        shutil.copytree(local_path(spec.run_dir), snapshot)
        _interrupted.append(Interrupted(reference, tries, snapshot, files))
    return _interrupted[0]


def finished_after_the_kills(
    tmp_path_factory: pytest.TempPathFactory, files: list[str]
) -> tuple[JobRun, str]:
    """Try 4 of `interrupted_run` on 2 ranks, on a copy of the directory the kills left, run to
    the end once per session: (the run, its run directory)."""
    from airflow_trainpipe.runtime.collectives import CHECK_ENV

    interrupted = interrupted_run(tmp_path_factory, files)
    if interrupted.finished is None:
        root = tmp_path_factory.mktemp("finished_after_the_kills")
        interrupted.finished = interrupted.resume(root, env={CHECK_ENV: "nccl"})
    return interrupted.finished


def run_job(
    spec: TrainSpec,
    nproc: int = 2,
    *,
    pause_at: str | None = None,
    env: dict[str, str] | None = None,
    before_kill: Callable[[], None] | None = None,
    timeout: float | None = None,
    on_line: Callable[[Line, LocalLauncher], None] | None = None,
    forked: bool = True,
) -> JobRun:
    """Run to the end, or until `pause_at`, where the whole job is killed with SIGKILL (after
    `before_kill` returns, when given), or until `timeout` seconds, when it is killed too.
    `on_line` sees every line of output with the launcher, to signal the job itself.

    `forked` (the default): torchrun's agent and its ranks forked from this process's warm parent
    (ForkedLauncher, as `trainpipe tune` runs a CPU trial), which imported torch, DeepSpeed and
    MLflow once for the session: ~7 s less per job than the torchrun command, whose ranks import
    them again (BENCHMARKS.md, "Start-up of a training job"). The same agent, the same ranks'
    environment and the same entrypoint (tests/launchers/test_forked.py trains bit for bit what
    the command trains, on 1 and 2 ranks). `forked=False` runs the torchrun command, as the train
    task does: for tests whose subject is that launch (its signals, its process tree, a cold
    rank's start)."""
    job_env = {**(env or {}), **({"TRAINPIPE_PAUSE_AT": pause_at} if pause_at else {})}
    if forked:
        from airflow_trainpipe.launchers.forked import ForkedLauncher

        launcher: LocalLauncher = ForkedLauncher(spec, nproc, env=job_env)
    else:
        launcher = LocalLauncher(spec, nproc, env=job_env)
    launcher.start()
    run = JobRun(code=-1)
    killer = threading.Timer(timeout, launcher.kill) if timeout else None
    if killer is not None:
        killer.start()
    try:
        for line in launcher.lines():
            run.output.append(line.text)
            if on_line is not None:
                on_line(line, launcher)
            event = line.event or {}
            if event.get("event") in ("step", "progress"):
                run.losses[event["step"]] = event["loss"]
            elif event.get("event") == "start":
                run.start = event
            elif event.get("event") == "result":
                run.result = event
            if pause_at and f"TRAINPIPE PAUSED {pause_at}" in line.text:
                if before_kill is not None:
                    before_kill()
                launcher.kill()  # kill -9 every process of the job
        run.code = launcher.wait()
    finally:
        if killer is not None:
            killer.cancel()
        launcher.kill()
    return run


def holdout_rows(files: list[str], data: Any, count: int) -> Any:
    """The first `count` holdout rows of `files` (config section `data`), raw, as a job reads them:
    the rows whose predictions it logs in holdout_predictions.json."""
    import pyarrow as pa

    from airflow_trainpipe.runtime.data.reader import HoldoutSplit, read_table

    table = read_table(files, data.format, [*data.features.all, data.label, data.holdout.key_column])
    return table.filter(pa.array(HoldoutSplit(data).mask(table))).select(data.features.all).slice(0, count)


def served_in_a_fresh_interpreter(model_uri: str, rows: Any, tracking_uri: str, folder: Path) -> Any:
    """What `mlflow.pyfunc.load_model(model_uri).predict(rows)` returns in a fresh interpreter
    (nothing of the test's process loaded), as a numpy array: its probabilities (or scores), the
    `predicted_label` column left out."""
    import json
    import os
    import subprocess
    import sys

    import numpy as np

    rows.to_pandas().to_parquet(folder / "raw.parquet")
    code = (
        "import json, mlflow, pandas as pd\n"
        f"model = mlflow.pyfunc.load_model({model_uri!r})\n"
        f"answer = model.predict(pd.read_parquet({str(folder / 'raw.parquet')!r}))\n"
        "answer = answer.drop(columns=['predicted_label']) if hasattr(answer, 'columns') else answer\n"
        "print(json.dumps(answer.values.tolist() if hasattr(answer, 'values') else answer.tolist()))"
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True, timeout=300
    )
    return np.array(json.loads(out.stdout.strip().splitlines()[-1]))


def still_running(processes: list[Any], within_s: float = 10) -> list[int]:
    """The pids of `processes` (psutil.Process) still running, zombies aside, after up to
    `within_s` seconds of waiting for them to end."""
    import psutil

    def running() -> list[int]:
        return [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and running():
        time.sleep(0.1)
    return running()


def warm_parents(recursive: bool = False) -> list[Any]:
    """This process's warm parents (launchers/forked.py: forkserver children, psutil.Process), not
    the jobs forked from them. A warm parent names the training entrypoint among its preloads.

    `recursive`: every warm parent under this process, those of its children too (a dag.test()
    worker an earlier test left for the next keeps its own: tests/helpers/dag_test_worker.py).
    A job forked from a warm parent keeps its command line; its parent is what tells them apart."""
    import psutil

    def forkserver(process: Any) -> bool:
        return "multiprocessing.forkserver" in " ".join(process.cmdline())

    found = []
    for process in psutil.Process().children(recursive=recursive):
        try:
            if (
                process.status() != psutil.STATUS_ZOMBIE
                and forkserver(process)
                and not forkserver(process.parent())
            ):
                found.append(process)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
    return found
