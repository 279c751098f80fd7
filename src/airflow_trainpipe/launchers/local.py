"""Run the training entrypoint under torchrun as a child of this process.

torchrun starts each rank in a session of its own (start_new_session=True), so signalling
torchrun's process group alone would leave ranks training. `kill()` therefore signals every
process group of the job's process tree. For the case where this process is SIGKILLed itself
and cannot clean up, torchrun gets SIGTERM when it dies and each rank when torchrun dies
(PR_SET_PDEATHSIG, processes.py): the ranks take it as a preemption notice, save, and exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from airflow_trainpipe.contracts.events import parse
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.core.processes import signal_on_parent_death
from airflow_trainpipe.launchers.command import torchrun_command, torchrun_environment

HOST_RANKS_ENV = "TRAINPIPE_HOST_RANKS"


@dataclass
class Line:
    text: str
    event: dict[str, Any] | None


def threads_per_rank(nproc: int, jobs_on_host: int = 1) -> int:
    """This host's cores shared out between every rank of the jobs that run on it at once.

    torchrun sets OMP_NUM_THREADS=1 only for more than one rank; a one-rank job keeps torch's
    default, a thread per core. Two such jobs side by side (two trials) put twice as many spinning
    OpenMP threads as cores on the host, and each ran 13x slower than alone (BENCHMARKS.md, Tuning).

    A worker whose training pool lets several jobs run at once says how many ranks that is in
    TRAINPIPE_HOST_RANKS (the pool's slots; `make up` sets it): each rank then gets its share of
    the cores when the pool is full, not the whole host each job would otherwise assume it has.
    """
    ranks = nproc * jobs_on_host
    host = os.environ.get(HOST_RANKS_ENV, "")
    if host.isdigit() and int(host) > 0:
        ranks = max(ranks, int(host))
    return max(1, len(os.sched_getaffinity(0)) // ranks)


def job_environment(
    gpus_per_node: int, nproc: int, jobs_on_host: int = 1, env: dict[str, str] | None = None
) -> dict[str, str]:
    """This process's environment with `env` over it, as every rank of a local job gets it."""
    job = {**os.environ, **(env or {})}
    # A value the user set wins: they know their host.
    job.setdefault("OMP_NUM_THREADS", str(threads_per_rank(nproc, jobs_on_host)))
    if gpus_per_node == 0:
        job.setdefault("DS_ACCELERATOR", "cpu")
    job.setdefault("PYTHONUNBUFFERED", "1")
    job.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched from a model hub, ever
    # As in an activated virtualenv, whether or not Airflow was started from one: the ranks'
    # tools are their interpreter's. DeepSpeed builds its CPU op with the first `ninja` on PATH,
    # and the venv's (DeepSpeed's dependency) and the system's make different build layouts
    # (runtime/extensions.py): `make demo` built the op a second time with the system's.
    tools = os.path.dirname(sys.executable)
    path = job.get("PATH", "")
    if path.split(os.pathsep, 1)[0] != tools:
        job["PATH"] = os.pathsep.join(p for p in (tools, path) if p)
    return job


class LocalLauncher:
    """`jobs_on_host`: how many jobs this one runs beside (trials side by side), to share the cores."""

    def __init__(self, spec: TrainSpec, nproc: int, env: dict[str, str] | None = None, jobs_on_host: int = 1):
        self.spec, self.nproc = spec, nproc
        self.env = job_environment(spec.config.training.resources.gpus_per_node, nproc, jobs_on_host, env)
        self.process: subprocess.Popen[str] | None = None
        self._job_dir: tempfile.TemporaryDirectory[str] | None = None

    def start(self) -> None:
        spec_file = self._write_spec()
        checkpoint = self.spec.config.training.checkpoint
        self.process = subprocess.Popen(
            torchrun_command(
                self.nproc, f"@{spec_file}", python=sys.executable, log_dir=str(self._torchrun_log_dir())
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**self.env, **torchrun_environment(checkpoint.shutdown_timeout_s)},
            start_new_session=True,  # its own process group, see kill()
            # This process SIGKILLed (an Airflow task process killed) must not leave torchrun
            # training unseen beside the retry: it gets SIGTERM, which the ranks save on.
            preexec_fn=signal_on_parent_death,
        )

    def lines(self) -> Iterator[Line]:
        for raw in self._stream():
            text = raw.rstrip("\n")
            yield Line(text, parse(text))

    def wait(self) -> int:
        code = self._join()
        assert code is not None
        self._cleanup()
        return code

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal every process of the job: torchrun, every rank, and their children."""
        # A reaped process's pid may already belong to someone else: never signal it.
        if (pid := self._running_pid()) is not None:
            signal_job_tree(pid, sig)

    def stop(self, grace_s: float) -> None:
        """SIGTERM the job (the ranks save a checkpoint), SIGKILL what is left after `grace_s`."""
        self.kill(signal.SIGTERM)
        self._join(grace_s)
        self.kill(signal.SIGKILL)

    def _write_spec(self) -> Path:
        """The spec, in the job's own temporary directory, which `wait()` removes."""
        self._job_dir = tempfile.TemporaryDirectory(prefix="trainpipe-job-")
        spec_file = Path(self._job_dir.name) / "spec.json"
        spec_file.write_text(self.spec.to_json())
        return spec_file

    def _torchrun_log_dir(self) -> Path:
        """torchrun's log directory, inside the job's: torchrun's own default is a new directory
        in /tmp for every job, never removed (1,287 of them after a day of this project's tests)."""
        assert self._job_dir is not None
        return Path(self._job_dir.name) / "torchrun"

    # The job's process handle: what a torchrun child and a forked job (launchers/forked.py) differ in.

    def _stream(self) -> IO[str]:
        assert self.process is not None and self.process.stdout is not None
        return self.process.stdout

    def _running_pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def _join(self, timeout: float | None = None) -> int | None:
        """The exit code, or None when the job still runs after `timeout` seconds."""
        if self.process is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout=timeout)
        return None

    def _cleanup(self) -> None:
        if self._job_dir is not None:
            self._job_dir.cleanup()
            self._job_dir = None


def signal_job_tree(leader: int, sig: int) -> None:
    """Signal every process group of the tree under `leader`, which leads a session of its own."""
    import psutil

    groups = {leader}
    try:
        for child in psutil.Process(leader).children(recursive=True):
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(child.pid))
    except psutil.NoSuchProcess:
        pass
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, sig)
