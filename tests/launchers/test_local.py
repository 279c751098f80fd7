"""The local launcher leaves no rank behind, whatever kills the job."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from airflow_trainpipe.config.training import CheckpointSection
from airflow_trainpipe.launchers.command import torchrun_command
from airflow_trainpipe.launchers.local import LocalLauncher
from tests.helpers.jobs import make_spec


def test_torchrun_command_runs_the_single_entrypoint() -> None:
    command = torchrun_command(
        2, "@/tmp/spec.json", CheckpointSection().shutdown_timeout_s, python=sys.executable
    )
    assert command[1:3] == ["-m", "torch.distributed.run"]
    assert command[-4:] == ["-m", "airflow_trainpipe.runtime.train", "--spec", "@/tmp/spec.json"]
    assert command[command.index("--shutdown-timeout") + 1] == "35"


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
    launcher = LocalLauncher(spec, 2, env={"TRAINPIPE_PAUSE_AT": "step:3"})
    launcher.start()
    paused = 0
    for line in launcher.lines():
        paused += line.text.count("TRAINPIPE PAUSED step:3")
        if paused == 2:  # both ranks are inside the job
            break
    processes = _job_processes(launcher)
    assert sum("airflow_trainpipe.runtime.train" in " ".join(p.cmdline()) for p in processes) >= 2
    if how == "launcher_kill":
        launcher.kill()
    else:
        # Only torchrun dies: the ranks get SIGTERM through PR_SET_PDEATHSIG and follow it.
        launcher.process.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes
    ):
        time.sleep(0.1)
    assert [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
