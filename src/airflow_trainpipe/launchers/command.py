"""The one training command: torchrun around `python -m airflow_trainpipe.runtime.train`, the same
for the local launcher's child process and a Kubernetes pod's container; only the interpreter and
the rendezvous differ."""

from __future__ import annotations

ENTRYPOINT = "airflow_trainpipe.runtime.train"

# torchrun reads every option from PET_<OPTION> when it is not on the command line. The shutdown
# timeout goes there rather than into `--shutdown-timeout`: torch 2.11's torchrun (a CUDA image's)
# has no such option and refuses the whole command line with an argparse usage dump, while an
# environment variable it does not know is left alone. That torchrun then SIGKILLs the ranks in
# its own fixed 30 s; rank 0 says so in the job's log (runtime/train.py, `_shutdown_timeout_note`).
SHUTDOWN_TIMEOUT_ENV = "PET_SHUTDOWN_TIMEOUT"


def torchrun_command(
    nproc: int,
    spec_arg: str,
    *,
    python: str,
    rendezvous: tuple[str, ...] = ("--standalone",),
    log_dir: str | None = None,
) -> list[str]:
    """`rendezvous`: one node alone, or how the nodes of a Kubernetes job find each other.
    `log_dir`: where torchrun keeps its per-rank error files; without one it makes a directory in
    the system's temporary directory for every job and never removes it. Only options every
    torchrun since torch 2.1 accepts; the shutdown timeout is `torchrun_environment`'s."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        *rendezvous,
        *(("--log-dir", log_dir) if log_dir is not None else ()),
        "-m",
        ENTRYPOINT,
        "--spec",
        spec_arg,
    ]


def torchrun_environment(shutdown_timeout_s: int) -> dict[str, str]:
    """What torchrun reads beside its command line: how long it waits, after forwarding a SIGTERM,
    before it SIGKILLs the ranks (`training.checkpoint.shutdown_timeout_s`, so that a preemption
    save is not cut short)."""
    return {SHUTDOWN_TIMEOUT_ENV: str(shutdown_timeout_s)}
