"""The local launcher leaves no rank behind, whatever kills the job."""

from __future__ import annotations

import argparse
import getpass
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from airflow_trainpipe.config.training import CheckpointSection
from airflow_trainpipe.launchers.command import torchrun_command, torchrun_environment
from airflow_trainpipe.launchers.local import LocalLauncher, job_environment, threads_per_rank
from airflow_trainpipe.runtime.train import shutdown_timeout_note
from tests.helpers.jobs import make_spec, still_running


def test_the_ranks_find_their_interpreters_tools_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Airflow started without activating its venv: the ranks still build DeepSpeed's op with
    the venv's ninja, the layout `make venv` prebuilt it in (runtime/extensions.py)."""
    tools = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = job_environment(gpus_per_node=0, nproc=2)
    assert env["PATH"].split(os.pathsep) == [tools, "/usr/bin", "/bin"]
    monkeypatch.setenv("PATH", env["PATH"])
    assert job_environment(gpus_per_node=0, nproc=2)["PATH"] == env["PATH"]  # once


def test_torchrun_command_runs_the_single_entrypoint() -> None:
    command = torchrun_command(2, "@/tmp/spec.json", python=sys.executable)
    assert command[1:3] == ["-m", "torch.distributed.run"]
    assert command[-4:] == ["-m", "airflow_trainpipe.runtime.train", "--spec", "@/tmp/spec.json"]
    logged = torchrun_command(2, "@/tmp/job/spec.json", python=sys.executable, log_dir="/tmp/job/torchrun")
    assert _torchrun_parser(shutdown_timeout=False).parse_args(logged[3:]).log_dir == "/tmp/job/torchrun"


def _torchrun_parser(shutdown_timeout: bool) -> argparse.ArgumentParser:
    """This torch's torchrun parser, or the same without `--shutdown-timeout`, as torch 2.11's is."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    if not shutdown_timeout:
        (action,) = [a for a in parser._actions if "--shutdown-timeout" in a.option_strings]
        parser._remove_action(action)
        for option in action.option_strings:
            del parser._option_string_actions[option]
    return parser


def test_torchrun_reads_the_shutdown_timeout_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    command = torchrun_command(2, "@/tmp/spec.json", python=sys.executable)
    for name, value in torchrun_environment(CheckpointSection().shutdown_timeout_s).items():
        monkeypatch.setenv(name, value)
    # The grace (30 s by default) and the ranks' exit before torchrun SIGKILLs them.
    assert _torchrun_parser(shutdown_timeout=True).parse_args(command[3:]).shutdown_timeout == 35


def test_a_torchrun_without_a_shutdown_timeout_option_takes_the_command_and_the_job_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch 2.11's torchrun (a CUDA image's) refused `--shutdown-timeout` with a bare usage dump.
    command = torchrun_command(2, "@/tmp/spec.json", python=sys.executable)
    monkeypatch.setenv("PET_SHUTDOWN_TIMEOUT", "35")
    old = _torchrun_parser(shutdown_timeout=False)
    assert old.parse_args(command[3:]).training_script == "airflow_trainpipe.runtime.train"
    note = shutdown_timeout_note(35, old)
    assert note is not None and "has no --shutdown-timeout" in note and "not the 35 s" in note
    assert shutdown_timeout_note(25, old) is None  # its own 30 s are enough for what was asked
    assert shutdown_timeout_note(35, _torchrun_parser(shutdown_timeout=True)) is None
    assert shutdown_timeout_note(35) is None  # this torch's own torchrun honours it


def _job_processes(launcher: LocalLauncher) -> list[psutil.Process]:
    return [
        launcher_process := psutil.Process(launcher.process.pid),
        *launcher_process.children(recursive=True),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["launcher_kill", "torchrun_sigkill"])
def test_no_rank_survives(tmp_path: Path, trainpipe_home: Path, job_files: list[str], how: str) -> None:
    # The paused ranks cannot reach their next step to save: their 3 s grace clock ends them.
    spec = make_spec(tmp_path, job_files, "orphans", preemption_grace=3)
    temporary = tmp_path / "tmp"  # the job's TMPDIR: nothing may be left in it
    temporary.mkdir()
    launcher = LocalLauncher(spec, 2, env={"TRAINPIPE_PAUSE_AT": "step:3", "TMPDIR": str(temporary)})
    launcher.start()
    paused = 0
    for line in launcher.lines():
        paused += line.text.count("TRAINPIPE PAUSED step:3")
        if paused == 2:  # both ranks are inside the job
            break
    processes = _job_processes(launcher)
    assert sum("airflow_trainpipe.runtime.train" in " ".join(p.cmdline()) for p in processes) >= 2
    # torchrun's per-rank directories are in the job's own directory, which wait() removes.
    job_dir = launcher._torchrun_log_dir().parent
    assert len(list(launcher._torchrun_log_dir().glob("*/attempt_0/[01]"))) == 2, list(job_dir.rglob("*"))
    if how == "launcher_kill":
        launcher.kill()
    else:
        # Only torchrun dies: the ranks get SIGTERM through PR_SET_PDEATHSIG and follow it.
        launcher.process.send_signal(signal.SIGKILL)
    launcher.wait()
    assert still_running(processes) == []
    assert not job_dir.exists()
    # At most inductor's compile cache is left, one per user and reused by every job (DeepSpeed
    # compiles its Muon kernels as it is imported where inductor can; CI's machine made none):
    # torchrun's own default made a directory per job.
    assert {p.name for p in temporary.iterdir()} <= {f"torchinductor_{getpass.getuser()}"}


@pytest.mark.parametrize(
    ("cores", "nproc", "jobs", "threads"), [(16, 1, 1, 16), (16, 2, 2, 4), (2, 1, 2, 1), (2, 2, 2, 1)]
)
def test_the_host_cores_are_shared_between_every_rank_of_the_jobs_side_by_side(
    monkeypatch: pytest.MonkeyPatch, cores: int, nproc: int, jobs: int, threads: int
) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)))
    assert threads_per_rank(nproc, jobs) == threads


@pytest.mark.parametrize(("host_ranks", "threads"), [(None, 8), ("8", 2), ("1", 8), ("not a number", 8)])
def test_a_worker_whose_pool_runs_several_jobs_gives_each_rank_its_share_of_a_full_pool(
    monkeypatch: pytest.MonkeyPatch, host_ranks: str | None, threads: int
) -> None:
    # 16 cores, a 2-rank job: alone it would take 8 threads a rank; in a pool of 8 ranks, 4 such
    # jobs run at once and 8 threads each would put 64 on 16 cores.
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    if host_ranks is None:
        monkeypatch.delenv("TRAINPIPE_HOST_RANKS", raising=False)
    else:
        monkeypatch.setenv("TRAINPIPE_HOST_RANKS", host_ranks)
    assert threads_per_rank(2) == threads


def test_a_thread_count_the_user_set_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, job_files: list[str]
) -> None:
    spec = make_spec(tmp_path, job_files, "threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert LocalLauncher(spec, 1, jobs_on_host=2).env["OMP_NUM_THREADS"] == "3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    expected = str(threads_per_rank(1, 2))
    assert LocalLauncher(spec, 1, jobs_on_host=2).env["OMP_NUM_THREADS"] == expected


@pytest.mark.slow
def test_a_rank_of_a_job_beside_another_gets_its_share_of_the_cores(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # One rank alone would keep torch's thread per core: two trials side by side then put twice
    # as many spinning threads as cores on the host (13x slower each, BENCHMARKS.md Tuning).
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    spec = make_spec(tmp_path, job_files, "share", preemption_grace=3)
    launcher = LocalLauncher(spec, 1, env={"TRAINPIPE_PAUSE_AT": "step:3"}, jobs_on_host=2)
    launcher.start()
    try:
        for line in launcher.lines():
            if "TRAINPIPE PAUSED step:3" in line.text:
                break
        ranks = [
            p for p in _job_processes(launcher) if "airflow_trainpipe.runtime.train" in " ".join(p.cmdline())
        ]
        rank = next(p for p in ranks if "torch.distributed.run" not in " ".join(p.cmdline()))
        assert rank.environ()["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))
    finally:
        launcher.kill()
        launcher.wait()
