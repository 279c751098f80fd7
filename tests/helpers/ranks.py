"""Real gloo worlds of spawned processes, for the runtime's collectives (stream, holdout)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path

from airflow_trainpipe.runtime.data.prepare import PreparedData

Worker = Callable[[str, int, int, str, list[str], str], None]
"""worker(store, rank, world_size, prepared_file, files, out): joins the group at `store`
(`init_method=f"file://{store}"`), works on `files` with the fit in `prepared_file`, writes `out`."""


def run_ranks(
    tmp_path: Path, worker: Worker, files: list[str], prepared: PreparedData, world_size: int, suffix: str
) -> list[Path]:
    """Run `worker` as ranks 0..world_size-1 of one world; returns each rank's `out` file.

    Each rank is a process of its own forked from this process's warm parent (launchers/forked.py:
    torch, DeepSpeed and the runtime imported once, nothing run; started once per session), not a
    spawned interpreter that imports torch again: ~3 s of each rank's start on 2 cores. The worker
    is named by reference, as for spawn, and the ranks meet in gloo as before."""
    from airflow_trainpipe.launchers.forked import warm_parent
    from airflow_trainpipe.launchers.local import job_environment

    prepared_file = tmp_path / "prepared.json"
    prepared_file.write_text(prepared.to_json())
    warm_parent(job_environment(gpus_per_node=0, nproc=world_size))  # as a CPU job's forks see it
    context = multiprocessing.get_context("forkserver")
    outs = [tmp_path / f"rank{r}{suffix}" for r in range(world_size)]
    store = str(tmp_path / "store")
    processes = [
        context.Process(target=worker, args=(store, r, world_size, str(prepared_file), files, str(outs[r])))
        for r in range(world_size)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    return outs
