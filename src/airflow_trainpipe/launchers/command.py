"""The one training command: torchrun around `python -m airflow_trainpipe.runtime.train`, the same
for the local launcher's child process and a Kubernetes pod's container; only the interpreter and
the rendezvous differ."""

from __future__ import annotations

ENTRYPOINT = "airflow_trainpipe.runtime.train"


def torchrun_command(
    nproc: int,
    spec_arg: str,
    shutdown_timeout_s: int,
    *,
    python: str,
    rendezvous: tuple[str, ...] = ("--standalone",),
) -> list[str]:
    """`shutdown_timeout_s` is how long torchrun waits, after forwarding a SIGTERM, before it
    SIGKILLs the ranks: `training.checkpoint.shutdown_timeout_s`, so a preemption save is not cut
    short. `rendezvous`: one node alone, or how the nodes of a Kubernetes job find each other."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--shutdown-timeout",
        str(shutdown_timeout_s),
        *rendezvous,
        "-m",
        ENTRYPOINT,
        "--spec",
        spec_arg,
    ]
