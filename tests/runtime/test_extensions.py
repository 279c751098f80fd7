"""A DeepSpeed op build that died never makes later jobs wait forever on its lock, and two
interpreters never rebuild an op in turn."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from airflow_trainpipe.runtime.extensions import (
    STALE_AFTER_S,
    build_layout,
    clear_stale_build_locks,
    exclusive_build,
    layout_build_root,
    use_layout_build_root,
)


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
def test_a_job_starts_despite_the_lock_of_a_loader_that_just_died(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    """What a rank SIGKILLed during its first second leaves: before, every later job hung before
    step 1 (for good, or until the lock was older than any build)."""
    from torch.utils.cpp_extension import _get_build_directory

    from tests.helpers.jobs import make_spec, run_job

    # Where the rank loads the op: this interpreter's layout, as the launched rank's is.
    lock = layout_build_root() / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()  # fresh: no age rule could tell it from a live build's
    assert lock.parents[2] == Path(_get_build_directory("deepspeed_shm_comm", verbose=False)).parent
    spec = make_spec(tmp_path, job_files, "after_a_dead_load").limited_to(2)
    run = run_job(spec, timeout=240, forked=False)  # a cold rank, as a train task's, loads the op
    assert run.code == 0, run.text[-3000:]
    assert f"removed {lock}, left by a DeepSpeed op build or load that died" in run.text


def test_the_build_flock_is_held_until_its_holder_lets_go(tmp_path: Path) -> None:
    """A second loader waits for the first; under the flock the op's lock file is a dead one's."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline() == "holding\n"
    lock = tmp_path / "op" / "lock"
    lock.parent.mkdir()
    lock.touch()  # as if the holder were loading the op right now
    entered = threading.Event()

    def second_loader() -> None:
        with exclusive_build("op", tmp_path):
            entered.set()

    waiter = threading.Thread(target=second_loader)
    waiter.start()
    assert not entered.wait(1.0) and lock.exists()  # a live holder's lock is left alone
    holder.kill()  # dies holding it: the kernel lets go
    holder.wait()
    assert entered.wait(10.0)
    waiter.join()
    assert not lock.exists()


HOLDER = """
import sys, time
from airflow_trainpipe.runtime.extensions import exclusive_build
with exclusive_build("other", sys.argv[1]):
    print("holding", flush=True)
    time.sleep(300)
"""


def test_each_build_layout_has_a_folder_of_its_own_under_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    here = build_layout()
    assert here["deepspeed"].endswith("deepspeed") and here["torch"].endswith("torch")
    assert here["ninja"][:1].isdigit()  # the version: what decides whether its logs read alike
    through_a_link = {**here, "deepspeed": "/elsewhere/site-packages/deepspeed"}
    ours, theirs = layout_build_root(here), layout_build_root(through_a_link)
    assert ours.parent == theirs.parent == tmp_path and ours != theirs
    assert layout_build_root(dict(here)) == ours  # stable for one layout
    # A rank sets it for every op it loads; its children's own layouts go beside it, not inside.
    assert use_layout_build_root() == ours and os.environ["TORCH_EXTENSIONS_DIR"] == str(ours)
    assert layout_build_root(through_a_link) == theirs
    assert use_layout_build_root() == ours


@pytest.mark.slow
def test_a_venv_reached_through_a_symlink_builds_apart_from_its_real_path(tmp_path: Path) -> None:
    """What made jobs rebuild the op in turn: the same venv through two spellings of its path
    (a checkout whose .venv links to another's) writes build commands that differ only in them."""
    link = tmp_path / "venv-link"
    link.symlink_to(sys.prefix, target_is_directory=True)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions")}
    probe = "from airflow_trainpipe.runtime.extensions import layout_build_root as r; print(r())"
    interpreters = [Path(sys.executable), link / "bin" / Path(sys.executable).name]
    runs = [
        subprocess.Popen([str(python), "-c", probe], env=env, stdout=subprocess.PIPE, text=True)
        for python in interpreters
    ]
    # The last line: DeepSpeed prints its accelerator choice first.
    real, linked = (Path(run.communicate(timeout=120)[0].splitlines()[-1]) for run in runs)
    assert real.parent == linked.parent == tmp_path / "extensions"
    assert real != linked
