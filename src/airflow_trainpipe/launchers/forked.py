"""Start one-rank training jobs as forks of a warm parent that imported the runtime once.

A job under torchrun pays about 7 s before its first step, most of it importing torch, DeepSpeed,
MLflow and torch._dynamo and torchrun's own start (BENCHMARKS.md, "Start-up of a training job");
a tuning study pays that once per trial, which is what kept successive halving from saving wall
time on small data (issue 40). Python's own forkserver imports them once in a parent of its own
(`set_forkserver_preload`) and forks each job from it, so a job starts where the imports ended.

A forked job is still a job of its own: its own process and session (signalled as a group, like
torchrun's), its own run directory, checkpoints and MLflow run, output and exit code; it runs
the entrypoint's `main` (launchers/command.py) exactly as a torchrun rank does, with the environment torchrun would give a
single rank. Only one-rank CPU jobs are forked (`forkable`).

The warm parent only imports: no Python thread, no open connection or store, no CUDA context,
no OpenMP pool (no tensor op has run), which is what makes forking it safe. The imports do start
two native threads (one of torch's, and jemalloc's background thread), which a fork does not
copy; jemalloc re-arms its own after a fork. It ends when this process does, and a job whose
warm parent died gets SIGTERM (a preemption notice: it saves and exits).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import IO

from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.launchers.command import ENTRYPOINT
from airflow_trainpipe.launchers.local import LocalLauncher

PRELOAD = [
    "torch",
    "torch._dynamo",  # the AdamW constructor imports it: 1.6 s of a cold job's start-up
    "deepspeed",
    # DeepSpeed's engine imports its Muon optimizer to check ours against ZeRO's list, and ZeRO's
    # gradient reduction imports it again; its kernels are torch.compile'd as it is imported,
    # which imports inductor: 1.4 s of every job's engine, for an optimizer no job uses.
    "deepspeed.runtime.zero.muon.muon_optimizer",
    "mlflow",
    # The SQL stores (the embedded sqlite:// store) and pyfunc (log_model) are imported on first
    # use: 0.7 s of the tracking lap and of the end.
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    "mlflow.pyfunc",
    "optuna",
    ENTRYPOINT,  # by name, as torchrun's command line names it: launchers do not import the runtime
    __name__,
]


def forkable(gpus_per_node: int, nproc: int) -> bool:
    """One rank on CPU. More ranks need torchrun's rendezvous and its handling of a dying rank; a
    GPU job must not be forked from a parent whose imports may have initialised CUDA (DeepSpeed
    asks torch.cuda while it is imported), which a forked child cannot use."""
    return nproc == 1 and gpus_per_node == 0


_warm: dict[str, float | None] = {"seconds": None}
_warm_lock = threading.Lock()


def warm_parent(env: dict[str, str]) -> float:
    """Start this process's warm parent (once) and return what starting it took: its own
    interpreter, the imports and one fork. Jobs forked later do not pay it again, but a study
    that uses them does once, so its accounting adds it (tuning/local.py).

    `env`: the environment the imports see. DeepSpeed picks its accelerator while it is imported
    (DS_ACCELERATOR), so the parent must be started with the jobs' value."""
    with _warm_lock:
        if _warm["seconds"] is None:
            started = time.perf_counter()
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            saved = dict(os.environ)
            os.environ.update({k: env[k] for k in ("DS_ACCELERATOR", "HF_HUB_OFFLINE") if k in env})
            try:
                probe = context.Process(target=_nothing, name="trainpipe-warm-parent-probe")
                probe.start()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            probe.join()
            seconds = _warm["seconds"] = time.perf_counter() - started
            return seconds
    return 0.0


def stop_warm_parent() -> None:
    """End the warm parent once no job forked from it runs (a job still running would get its
    SIGTERM); the next `warm_parent()` starts a new one. A process that ends needs no call: the
    warm parent ends with it."""
    from multiprocessing import forkserver

    with _warm_lock:
        # The standard library's own stop (its tests use it): closes the parent's alive pipe.
        forkserver._forkserver._stop()  # type: ignore[attr-defined]  # private, not in typeshed
        _warm["seconds"] = None


class ForkedLauncher(LocalLauncher):
    """LocalLauncher (start, lines, wait, kill, stop) for a one-rank job forked from the warm
    parent instead of started under torchrun: only the process handle differs."""

    def __init__(self, spec: TrainSpec, env: dict[str, str] | None = None, jobs_on_host: int = 1):
        super().__init__(spec, 1, env=env, jobs_on_host=jobs_on_host)
        self.job: multiprocessing.process.BaseProcess | None = None
        self._output: IO[str] | None = None

    def start(self) -> None:
        warm_parent(self.env)
        spec_file = self._write_spec()
        context = multiprocessing.get_context("forkserver")
        reader, writer = context.Pipe(duplex=False)
        env = {**self.env, **_single_rank()}
        self.job = context.Process(
            target=_job, args=(str(spec_file), env, writer), name=f"trainpipe-job-{self.spec.run_id}"
        )
        self.job.start()
        writer.close()  # the job holds the only writer: its end is the output's end
        self._output = os.fdopen(os.dup(reader.fileno()), "r", buffering=1, errors="replace")
        reader.close()

    def _stream(self) -> IO[str]:
        assert self._output is not None
        return self._output

    def _running_pid(self) -> int | None:
        if self.job is None or self.job.exitcode is not None:  # exitcode polls: reaped, never signalled
            return None
        return self.job.pid

    def _join(self, timeout: float | None = None) -> int | None:
        if self.job is None:
            return None
        self.job.join(timeout)
        code = self.job.exitcode
        # As a shell (and torchrun) reports a process ended by a signal.
        return None if code is None else 128 - code if code < 0 else code

    def _cleanup(self) -> None:
        if self._output is not None:
            self._output.close()
            self._output = None
        super()._cleanup()


def _single_rank() -> dict[str, str]:
    """What torchrun sets for one rank on one node, but for the port: port 0 lets the rank's
    store bind whatever port is free when it binds. A port probed free here could be taken
    before the job binds it (by another job's connection, say), and a `trainpipe tune` trial has
    no retry to start it again; one rank needs no port that another rank must know."""
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "0",
    }


def _nothing() -> None:
    """The warm parent's first fork: it returns once the imports are done."""


def _job(spec_file: str, env: dict[str, str], output: Connection) -> None:
    """The forked job (runs in the warm parent's child)."""
    os.setsid()  # a group of its own, as torchrun's ranks: kill() signals it whole
    from airflow_trainpipe.core.processes import signal_on_parent_death

    signal_on_parent_death()  # the warm parent ends with the launcher: save and stop
    os.dup2(output.fileno(), 1)
    os.dup2(output.fileno(), 2)
    output.close()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    os.environ.clear()
    os.environ.update(env)
    import torch

    # OpenMP read OMP_NUM_THREADS when the warm parent loaded it, with the parent's environment.
    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    _thread_lock_for_progress_bars()
    import importlib

    code = 1
    try:
        code = importlib.import_module(ENTRYPOINT).main(["--spec", f"@{spec_file}"])
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        # As the torchrun entrypoint: no interpreter teardown (runtime/train.py says why).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _thread_lock_for_progress_bars() -> None:
    """tqdm (MLflow's artifact progress bars) guards its bars with a multiprocessing lock, a named
    semaphore registered with the warm parent's resource tracker; a job ends with os._exit and
    never unregisters it, so the tracker warned of a leak at the end of every study. Bars are
    never shared between jobs: a thread lock is enough."""
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
