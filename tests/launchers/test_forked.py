"""CPU jobs forked from the warm parent (torchrun's agent, which forks the ranks): the same
training as under the torchrun command, a job of their own, and nothing left behind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from airflow_trainpipe.contracts.events import parse
from airflow_trainpipe.core.exceptions import TrainingJobError
from airflow_trainpipe.launchers.forked import (
    FORK_LOCAL_JOBS_ENV,
    ForkedLauncher,
    forks_local_jobs,
    stop_warm_parent,
    warm_parent,
)
from airflow_trainpipe.launchers.local import job_environment
from tests.helpers.jobs import make_spec, run_job, still_running, warm_parents


@pytest.fixture(autouse=True, scope="module")
def _warm_parent_stopped_after() -> Iterator[None]:
    """The warm parent is a child of this process: later tests find no training process under it."""
    yield
    stop_warm_parent()


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_a_forked_job_trains_exactly_what_the_same_job_under_torchrun_trains(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str], nproc: int
) -> None:
    one_thread = {"OMP_NUM_THREADS": "1"}  # the same reduction order in both
    torchrun = run_job(
        make_spec(tmp_path / "a", job_files, "under-torchrun"), nproc, env=one_thread, forked=False
    )
    forked = run_job(make_spec(tmp_path / "b", job_files, "forked"), nproc, env=one_thread, forked=True)
    assert torchrun.code == 0, torchrun.text[-3000:]
    assert forked.code == 0, forked.text[-3000:]
    assert forked.losses == torchrun.losses and len(forked.losses) > 10
    assert forked.result is not None and torchrun.result is not None
    assert forked.result["holdout_metrics"] == torchrun.result["holdout_metrics"]
    assert forked.result["world_size"] == torchrun.result["world_size"] == nproc
    assert forked.result["weights_sha256"] == torchrun.result["weights_sha256"]
    assert forked.start is not None and torchrun.start is not None
    assert forked.start["threads"] == torchrun.start["threads"] == 1
    # Its own job: its own MLflow run and run directory.
    assert forked.start["mlflow_run_id"] != torchrun.start["mlflow_run_id"]
    # Forked after the imports: its ranks import next to nothing; the agent's own phase is its
    # rendezvous, not an interpreter's start.
    startup = forked.start["startup"]
    assert startup["interpreter_and_imports"] < 0.5, startup
    assert torchrun.start["startup"]["interpreter_and_imports"] > 1.0, torchrun.start["startup"]


@pytest.mark.slow
def test_a_forked_job_gets_its_share_of_the_cores_and_leaves_nothing_when_killed(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The warm parent loaded OpenMP with its own environment: the job sets its threads itself.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    spec = make_spec(tmp_path, job_files, "forked-share", preemption_grace=3)
    launcher = ForkedLauncher(spec, env={"TRAINPIPE_PAUSE_AT": "step:3"}, jobs_on_host=2)
    launcher.start()
    try:
        start, paused, seen = None, False, []
        for line in launcher.lines():
            seen.append(line.text)
            if line.event and line.event.get("event") == "start":
                start = line.event
            if "TRAINPIPE PAUSED step:3" in line.text:
                paused = True
                break
        # Both seen, or the job ended on its own: nothing below would then be about a running job.
        assert start is not None and paused, "\n".join(seen[-40:])
        assert start["threads"] == max(1, len(os.sched_getaffinity(0)) // 2)
        assert launcher.job is not None and launcher.job.pid is not None
        job = psutil.Process(launcher.job.pid)  # torchrun's agent
        assert os.getpgid(job.pid) == job.pid  # a process group of its own, which holds the rank
        (rank,) = job.children()
        assert os.getpgid(rank.pid) == job.pid
        # The agent's rendezvous store listens on a port it chose as it bound (`--standalone`'s
        # localhost:0): a port probed free by the launcher could be taken before the job binds
        # it, and a CLI trial has no retry to start it again. The rank was told that port.
        listening = {c.laddr.port for c in job.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        connected = {c.raddr.port for c in rank.net_connections("tcp") if c.raddr}
        assert listening & connected, (listening, connected)
        processes = [job, *job.children(recursive=True)]
        # torchrun's per-rank directories are in the job's own, not a new one in /tmp per job.
        job_dir = launcher._torchrun_log_dir().parent
        assert list(launcher._torchrun_log_dir().glob("*/attempt_0/0")), list(job_dir.rglob("*"))
        launcher.kill()
        assert launcher.wait() == 128 + 9  # SIGKILL, reported as a shell reports it
        assert still_running(processes) == []
        assert not job_dir.exists()
    finally:
        launcher.kill()


@pytest.mark.slow
def test_a_forked_job_that_fails_says_why_and_exits_non_zero(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    run = run_job(make_spec(tmp_path, ["file:///nowhere/part-0.parquet"], "forked-missing"), 1, forked=True)
    assert run.code not in (0, 128 + 9), run.text[-3000:]  # its own failure, not a kill
    errors = [e for e in map(parse, run.output) if e and e["event"] == "error"]
    assert len(errors) == 1 and errors[0]["retryable"] is False, run.text[-3000:]  # bad data
    assert "nowhere/part-0.parquet" in errors[0]["error"]


# A DAG file, as `dag.test()` runs it: the launching process's main. Every child of a forkserver
# runs its parent's main again as __mp_main__ (multiprocessing.spawn.prepare); pytest's own main
# (`python -m pytest`) is one it skips, so only a script main shows it.
DAG_FILE_MAIN = """
import json, os, sys
from pathlib import Path

if __name__ == "__mp_main__":
    Path(os.environ["MAIN_RAN_IN"], str(os.getpid())).touch()

from airflow.sdk import DAG  # what a DAG file imports: Airflow, and its ORM hook with it

from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.launchers.forked import ForkedLauncher, _nothing

if __name__ == "__main__":
    launcher = ForkedLauncher(TrainSpec.model_validate_json(Path(sys.argv[1]).read_text()))
    launcher.start()
    output = [line.text for line in launcher.lines()]
    code = launcher.wait()
    job_ran_main = sorted(os.listdir(os.environ["MAIN_RAN_IN"]))
    import multiprocessing  # the standard library's child of the same warm parent, for contrast

    plain = multiprocessing.get_context("forkserver").Process(target=_nothing)
    plain.start()
    plain.join()
    print(json.dumps({"code": code, "job_ran_main": job_ran_main, "plain_child": plain.pid,
                      "after": sorted(os.listdir(os.environ["MAIN_RAN_IN"])), "tail": output[-30:]}))
"""


@pytest.mark.slow
def test_a_forked_job_does_not_run_the_launching_process_s_main_again(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    import json
    import subprocess
    import sys

    main = tmp_path / "pipelines_dag.py"
    main.write_text(DAG_FILE_MAIN)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(make_spec(tmp_path / "job", job_files, "forked-from-a-dag-file").to_json())
    ran = tmp_path / "main_ran_in"
    ran.mkdir()
    done = subprocess.run(
        [sys.executable, str(main), str(spec_file)],
        env={**os.environ, "MAIN_RAN_IN": str(ran)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["code"] == 0, "\n".join(report["tail"])
    # Neither the warm parent's probe, the job's agent nor its rank ran the DAG file again...
    assert report["job_ran_main"] == []
    # ...which the standard library's child of the same warm parent does.
    assert report["after"] == [str(report["plain_child"])]


def test_the_warm_parent_is_started_once_and_stopped() -> None:
    warm_parent(job_environment(0, 1))
    assert warm_parent(job_environment(0, 1)) == 0.0
    parents = warm_parents()
    assert len(parents) == 1
    stop_warm_parent()
    assert still_running(parents) == []
    assert warm_parent(job_environment(0, 1)) > 0.0  # a new one


def test_the_warm_parent_stops_though_a_process_forked_since_holds_its_pipe() -> None:
    """A dag.test() worker's task had started a process pool (forked workers) after its train task
    started the warm parent: each pool worker holds a copy of the pipe whose end tells the warm
    parent to stop, so the standard library's stop waited for an end that never came."""
    import multiprocessing
    import threading
    import time

    warm_parent(job_environment(0, 1))
    (parent,) = warm_parents()
    holder = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,), daemon=True)
    holder.start()
    try:
        stopper = threading.Thread(target=stop_warm_parent, daemon=True)
        stopper.start()
        stopper.join(30)
        assert not stopper.is_alive(), "stop_warm_parent() still waits for the warm parent"
        assert still_running([parent]) == []
        assert holder.is_alive()  # the other process is left alone
    finally:
        holder.kill()
        holder.join()


@pytest.mark.parametrize(
    ("value", "forks"),
    [(None, False), ("", False), ("0", False), ("no", False), ("1", True), (" True ", True)],
)
def test_the_train_task_forks_only_when_told_to(
    monkeypatch: pytest.MonkeyPatch, value: str | None, forks: bool
) -> None:
    from types import SimpleNamespace

    from airflow_trainpipe.operators.train import DistributedTrainOperator
    from tests.conftest import EXAMPLE_CONFIGS

    if value is None:
        monkeypatch.delenv(FORK_LOCAL_JOBS_ENV, raising=False)
    else:
        monkeypatch.setenv(FORK_LOCAL_JOBS_ENV, value)
    assert forks_local_jobs() is forks
    operator = DistributedTrainOperator(task_id="train", config=str(EXAMPLE_CONFIGS / "fraud_detector.yaml"))
    context = {"run_id": "manual__1", "ti": SimpleNamespace(try_number=1)}
    placement = operator.placement(context, SimpleNamespace(environment=dict))
    assert placement.fork is forks and placement.pods is None


def test_a_misspelt_fork_switch_fails_the_task_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORK_LOCAL_JOBS_ENV, "on")
    with pytest.raises(
        TrainingJobError, match=r"^TRAINPIPE_FORK_LOCAL_JOBS='on': expected 1, true or yes"
    ) as caught:
        forks_local_jobs()
    assert caught.value.retryable is False
