"""A DeepSpeed op build that died never makes later jobs wait forever on its lock."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from airflow_trainpipe.runtime.extensions import STALE_AFTER_S, clear_stale_build_locks


def test_only_locks_older_than_any_build_are_removed(tmp_path: Path) -> None:
    stale, fresh = tmp_path / "deepspeed_shm_comm" / "lock", tmp_path / "cpu_adam" / "lock"
    for lock in (stale, fresh):
        lock.parent.mkdir()
        lock.touch()
    old = time.time() - STALE_AFTER_S - 60
    os.utime(stale, (old, old))
    assert clear_stale_build_locks(tmp_path) == [stale]
    assert not stale.exists() and fresh.exists()  # a build in progress keeps its lock


@pytest.mark.slow
def test_a_job_starts_despite_the_lock_of_a_build_that_died(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    """What a Ctrl-C during the first `make demo` leaves: before, every later job hung before step 1."""
    from torch.utils.cpp_extension import get_default_build_root

    from tests.helpers.jobs import make_spec, run_job

    lock = Path(get_default_build_root()) / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    old = time.time() - STALE_AFTER_S - 60
    os.utime(lock, (old, old))
    spec = make_spec(tmp_path, job_files, "after_a_dead_build").limited_to(2)
    run = run_job(spec, timeout=240)
    assert run.code == 0, run.text[-3000:]
    assert f"removed {lock}" in run.text
