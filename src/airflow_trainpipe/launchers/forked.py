"""Start CPU training jobs as forks of a warm parent that imported the runtime once.

A job under the torchrun command pays about 7 s before its first step, most of it importing
torch, DeepSpeed, MLflow and torch._dynamo in every rank, and torchrun's own start (BENCHMARKS.md,
"Start-up of a training job"); a tuning study pays that once per trial, which is what kept
successive halving from saving wall time on small data (issue 40). Python's own forkserver
imports them once in a parent of its own (`set_forkserver_preload`) and forks each job from it,
so a job starts where the imports ended.

A forked job is torchrun's job all the same: the fork runs torchrun's own agent
(`torch.distributed.launcher.api.elastic_launch`, what the torchrun command runs after parsing its
arguments) with the command's `--standalone` rendezvous, and the agent forks the ranks
(`start_method="fork"`) instead of starting interpreters. So the ranks get the environment torchrun
gives them, meet in its rendezvous store (on a port the store chose as it bound: none is probed
free beforehand), a rank that fails stops the others, and a SIGTERM is forwarded with
`checkpoint.shutdown_timeout_s`. Each rank runs the entrypoint's `main` (launchers/command.py)
exactly as under the command. The job is a process group of its own, signalled whole, with its
own run directory, checkpoints, MLflow run, output and exit code. Only CPU jobs are forked
(`forkable`).

The warm parent only imports: no Python thread, no open connection or store, no CUDA context,
no OpenMP pool (no tensor op has run), which is what makes forking it safe. The imports do start
two native threads (one of torch's, and jemalloc's background thread), which a fork does not
copy; jemalloc re-arms its own after a fork. The agent forks the ranks before any of them has
run a tensor op either; its store's thread stays with the agent. The warm parent ends when this
process does, and a job whose warm parent died gets SIGTERM (a preemption notice: it saves and
exits).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing import forkserver, popen_forkserver, spawn, util
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerProcess, reduction, set_spawning_popen  # type: ignore[attr-defined]
from typing import IO, Any

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
    "torch.distributed.launcher.api",  # torchrun's agent, which every forked job runs
    ENTRYPOINT,  # by name, as torchrun's command line names it: launchers do not import the runtime
    __name__,
    "airflow_trainpipe.launchers.warm_parent_setup",  # after the imports: work done once (its docstring)
]


FORK_LOCAL_JOBS_ENV = "TRAINPIPE_FORK_LOCAL_JOBS"


def forks_local_jobs() -> bool:
    """Whether the train task of this process forks its local CPU jobs from a warm parent
    (TRAINPIPE_FORK_LOCAL_JOBS=1) instead of starting the torchrun command. Worth it where one
    process runs many jobs one after another, which then share the parent's imports: `dag.test()`
    of several runs in one Python session, a pipeline's own tests (this suite's `dag.test()`
    runs). On an Airflow worker each task is a process of its own, whose parent would import what
    the command's ranks import: nothing is gained there, so it is off unless set. A value that is
    neither on nor off fails the task rather than being read as off: a misspelt switch would
    otherwise go unnoticed."""
    value = os.environ.get(FORK_LOCAL_JOBS_ENV, "")
    word = value.strip().lower()
    if word in ("1", "true", "yes"):
        return True
    if word in ("", "0", "false", "no"):
        return False
    from airflow_trainpipe.core.exceptions import TrainingJobError

    raise TrainingJobError(
        f"{FORK_LOCAL_JOBS_ENV}={value!r}: expected 1, true or yes (fork the job from the warm "
        "parent) or 0, false, no or unset (start the torchrun command)",
        retryable=False,
    )


def forkable(gpus_per_node: int) -> bool:
    """A CPU job, of any number of ranks. A GPU job must not be forked from a parent whose imports
    may have initialised CUDA (DeepSpeed asks torch.cuda while it is imported), which a forked
    child cannot use: it runs under the torchrun command."""
    return gpus_per_node == 0


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
                probe = _JobProcess(target=_nothing, name="trainpipe-warm-parent-probe")
                probe.start()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            probe.join()
            seconds = _warm["seconds"] = time.perf_counter() - started
            return seconds
    return 0.0


class _JobProcess(ForkServerProcess):
    """A child of the warm parent that does not run this process's main module again.

    Before it unpickles its target, every child of a forkserver runs its launching process's
    `__main__` again, as `__mp_main__` (`multiprocessing.spawn.prepare`), in case the target was
    defined there. A job's target never is (`_agent`, here), but the main was a DAG file in a
    `dag.test()` session, `bin/airflow` in a worker, `bin/trainpipe` under `trainpipe tune`: each
    job imported Airflow and ran the DAG file again before its own start-up clock began (a 1-rank
    job from a DAG file that registers the example pipelines: 1.5-1.9 s to its first event, 0.5-0.8 s
    without). Airflow's import also set its ORM hook (import every Airflow model at the first
    SQLAlchemy mapper configured, `airflow.utils.orm_event_handlers`), which every rank then paid at
    its first MLflow or Optuna query: opening a trial's study took 1.05-1.46 s, 0.06-0.16 s without.
    A job runs no user code but the pipeline's, and has no Airflow in it."""

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _PopenWithoutMain(process_obj)


class _PopenWithoutMain(popen_forkserver.Popen):
    def _launch(self, process_obj: Any) -> None:
        # The standard library's (identical in Python 3.10 to 3.13), but for the preparation data,
        # which names no main module to run. The rest of it (sys.path, the working directory, the
        # authentication key) the child still gets.
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data.pop("init_main_from_path", None)
        prep_data.pop("init_main_from_name", None)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)  # type: ignore[attr-defined]
        # Keep a duplicate of the data pipe's write end as a sentinel of the parent process used
        # by the child process (as the standard library's does).
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))  # type: ignore[attr-defined]
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


def stop_warm_parent() -> None:
    """End the warm parent once no job forked from it runs (a job still running would get its
    SIGTERM); the next `warm_parent()` starts a new one. A process that ends needs no call: the
    warm parent ends with it."""
    import signal

    server: Any = forkserver._forkserver  # type: ignore[attr-defined]  # private, not in typeshed
    with _warm_lock:
        if (pid := server._forkserver_pid) is not None:
            # The standard library's stop closes the pipe whose end tells the parent to go, then
            # waits for it; but every process forked from this one since holds a copy of that
            # pipe (a task's process pool in a dag.test() worker did), and then the end never
            # comes and the wait never ends. SIGTERM ends the parent as that end would; a job
            # still forked from it gets its SIGTERM either way (PR_SET_PDEATHSIG).
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        server._stop()  # closes the pipe, reaps the parent, removes its socket
        _warm["seconds"] = None


class ForkedLauncher(LocalLauncher):
    """LocalLauncher (start, lines, wait, kill, stop) for a CPU job whose torchrun agent is forked
    from the warm parent instead of started as the torchrun command: only the process handle
    differs. `kill()` signals the agent's process group, which holds every rank."""

    def __init__(
        self, spec: TrainSpec, nproc: int = 1, env: dict[str, str] | None = None, jobs_on_host: int = 1
    ):
        super().__init__(spec, nproc, env=env, jobs_on_host=jobs_on_host)
        self.job: multiprocessing.process.BaseProcess | None = None
        self._output: IO[str] | None = None

    def start(self) -> None:
        warm_parent(self.env)
        spec_file = self._write_spec()
        context = multiprocessing.get_context("forkserver")
        reader, writer = context.Pipe(duplex=False)
        agent = AgentArgs(
            spec_file=str(spec_file),
            log_dir=str(self._torchrun_log_dir()),
            nproc=self.nproc,
            env=self.env,
            shutdown_timeout_s=self.spec.config.training.checkpoint.shutdown_timeout_s,
        )
        self.job = _JobProcess(target=_agent, args=(agent, writer), name=f"trainpipe-job-{self.spec.run_id}")
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


@dataclass(frozen=True)
class AgentArgs:
    """What the forked agent needs: it reads nothing else from the launcher."""

    spec_file: str
    log_dir: str
    nproc: int
    env: dict[str, str]
    shutdown_timeout_s: int


def _nothing() -> None:
    """The warm parent's first fork: it returns once the imports are done."""


def _agent(args: AgentArgs, output: Connection) -> None:
    """The forked job: torchrun's agent, with the torchrun command's `--standalone` rendezvous
    (runs in the warm parent's child). Its exit code is the command's: 0, or 1 when a rank
    failed (the failure summary on stderr, as the command prints it)."""
    os.setsid()  # a group of its own, which the forked ranks join: kill() signals it whole
    from airflow_trainpipe.core.processes import signal_on_parent_death

    signal_on_parent_death()  # the warm parent ends with the launcher: the ranks save and stop
    os.dup2(output.fileno(), 1)
    os.dup2(output.fileno(), 2)
    output.close()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    os.environ.clear()
    os.environ.update(args.env)
    _thread_lock_for_progress_bars()
    code = 1
    try:
        code = _launch(args)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _launch(args: AgentArgs) -> int:
    import signal
    import uuid

    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=args.nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",  # `--standalone`: a store of the agent's own, on a port it binds
        rdzv_endpoint="localhost:0",
        max_restarts=0,  # a retry is Airflow's, which resumes from the newest checkpoint
        monitor_interval=0.1,  # the command's default
        start_method="fork",
        shutdown_timeout=args.shutdown_timeout_s,
        logs_specs=DefaultLogsSpecs(log_dir=args.log_dir),  # the command's --log-dir
    )
    try:
        elastic_launch(config, entrypoint=_rank)(args.spec_file)
    except ChildFailedError as exc:
        print(exc, file=sys.stderr)  # the command's failure summary: which rank, its exit code
        return 1
    except SignalException as exc:  # SIGTERM: the agent forwarded it and waited for the ranks
        return 128 + int(exc.sigval) if isinstance(exc.sigval, signal.Signals) else 1
    return 0


def _rank(spec_file: str) -> int:
    """One rank, forked by the agent with the environment torchrun gives a rank."""
    import torch

    # OpenMP read OMP_NUM_THREADS when the warm parent loaded it, with the parent's environment.
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    import importlib

    try:
        code = importlib.import_module(ENTRYPOINT).main(["--spec", f"@{spec_file}"])
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if code != 0:
        # As the torchrun entrypoint: no interpreter teardown (runtime/train.py says why). The
        # agent sees the exit code, as the command's agent does.
        os._exit(code)
    # A rank that finished returns: the agent counts a rank done by its returned value. The
    # process still ends without interpreter teardown (multiprocessing's fork ends in os._exit).
    return 0


def _thread_lock_for_progress_bars() -> None:
    """tqdm (MLflow's artifact progress bars) guards its bars with a multiprocessing lock, a named
    semaphore registered with the warm parent's resource tracker; a job ends with os._exit and
    never unregisters it, so the tracker warned of a leak at the end of every study. Bars are
    never shared between jobs: a thread lock is enough."""
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
