"""The runtime's collectives on a GPU node's terms, checked on CPU (runtime/collectives.py).

On a GPU node the default process group is nccl, which refuses host tensors; on CPU it is gloo,
which takes anything, so a host tensor sent there passed every CPU test and crashed every GPU job
at its first sync. Under TRAINPIPE_CHECK_COLLECTIVES=nccl a CPU job refuses what nccl refuses;
every job the suite starts runs that way (tests/conftest.py). Here: the check catches that very
crash, and a whole job keeps the rule through its syncs, epoch-end evaluation, checkpoints,
resume and end.
"""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from airflow_trainpipe.config.training import CheckpointSection
from airflow_trainpipe.runtime.accounting import Timing
from airflow_trainpipe.runtime.collectives import (
    CHECK_ENV,
    checked,
    host_group,
    quiet_deepspeed_gather_deprecation,
    quiet_unbound_barrier,
)
from airflow_trainpipe.runtime.data.sampler import ResumableSampler
from airflow_trainpipe.runtime.resume.checkpoint import CheckpointManager
from airflow_trainpipe.runtime.steps import PeriodicSync, SyncConfig
from tests.helpers.jobs import KILLS, finished_after_the_kills, interrupted_run

NCCL_ERROR = "No backend type associated with device type cpu"


def _sync(tmp_path: Path, group: object) -> PeriodicSync:
    manager = CheckpointManager(
        CheckpointSection(every_steps=100), tmp_path.as_uri(), rank=0, local_rank=0, world_size=1,
        higher_is_better=True, group=group,
    )  # fmt: skip
    return PeriodicSync(SyncConfig(every=1), manager, world_size=1, tracker=None, group=group)


def _one_step(sync: PeriodicSync) -> None:
    sampler = ResumableSampler(40, 4, 1, 1, 0, seed=1)
    sampler.step_positions()
    sync.add(0.5)
    assert sync.after_step(1, 10, sampler, Timing(0, 0.0)) is not None


def test_the_periodic_sync_on_the_default_group_fails_as_nccl_fails_it(
    one_rank_world: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CHECK_ENV, "nccl")
    with (
        checked(),
        pytest.raises(RuntimeError, match=f"{NCCL_ERROR}: all_reduce.*airflow_trainpipe.runtime.steps"),
    ):
        _one_step(_sync(tmp_path, group=None))


def test_the_periodic_sync_on_the_host_group_passes_the_check(
    one_rank_world: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CHECK_ENV, "nccl")
    group = host_group(on_gpu=False)  # apart from the default group while checking, as on a GPU node
    assert group is not None
    with checked():
        _one_step(_sync(tmp_path, group=group))


def test_only_the_runtimes_own_calls_are_checked_and_the_functions_are_put_back(
    one_rank_world: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CHECK_ENV, "nccl")
    original = dist.all_reduce
    with checked():
        assert dist.all_reduce is not original
        dist.all_reduce(torch.ones(1))  # DeepSpeed's (here the test's) own traffic is not ours to judge
    assert dist.all_reduce is original
    monkeypatch.delenv(CHECK_ENV)
    with checked():
        assert dist.all_reduce is original  # unset: nothing is wrapped
    assert host_group(on_gpu=False) is None  # a CPU job's host group is its default group


def test_a_whole_job_keeps_the_rule_through_syncs_evaluation_checkpoints_resume_and_the_end(
    tmp_path_factory: pytest.TempPathFactory, trainpipe_home: Path, job_files: list[str]
) -> None:
    # The resume tests' stage-1 job (tests/helpers/jobs.py, trained once per session): 2 ranks, 19
    # steps an epoch, saves every 10, each try run with CHECK_ENV=nccl (what tests/conftest.py sets
    # for every job, said there in so many words). Killed -9 after step 13 (a sync and a save at
    # 10), mid-step 22 (resumed from 10: the epoch end at 19 with its evaluation and save, a sync
    # and a save at 20) and inside step 30's save (resumed from 20: the sync at 30); then resumed
    # from 20 and run to the end.
    interrupted = interrupted_run(tmp_path_factory, job_files)
    resumed, _ = finished_after_the_kills(tmp_path_factory, job_files)
    for killed, paused_at in zip(interrupted.tries, KILLS, strict=True):
        assert NCCL_ERROR not in killed.text, killed.text[-3000:]
        assert f"TRAINPIPE PAUSED {paused_at}" in killed.text, killed.text[-3000:]
    assert [t.start["resumed_from"] for t in interrupted.tries if t.start] == [0, 10, 20]
    assert NCCL_ERROR not in resumed.text, resumed.text[-3000:]
    assert resumed.code == 0, resumed.text[-3000:]
    assert resumed.start is not None and resumed.start["resumed_from"] == 20
    assert resumed.result is not None and resumed.result["final_step"] == 38
    # The end logs the model, validating its input example: MLflow's progress bars stay out of the log.
    assert "Validating input example" in resumed.text and "Downloading artifacts" not in resumed.text


def _torch_barrier_warning() -> str:
    """The text this torch warns with at a barrier on a group with no device bound."""
    source = inspect.getsource(dist.distributed_c10d.barrier)
    found = re.search(r'"(barrier\(\): [^"]*)"', source)
    assert found, "torch's barrier() no longer warns about the device under current context"
    return found.group(1)


@pytest.mark.parametrize(
    ("on_gpu", "world_size", "silenced"), [(True, 1, True), (True, 2, False), (False, 1, False)]
)
def test_the_unbound_barrier_warning_is_silenced_on_a_one_rank_gpu_job_only(
    on_gpu: bool, world_size: int, silenced: bool
) -> None:
    # On a one-rank GPU job DeepSpeed binds no device to the NCCL group (deepspeedai/DeepSpeed#8248),
    # so torch warns at each of its barriers; the text is read off the installed torch, so a torch
    # that rewords it fails here rather than flooding a GPU job's log again.
    message = _torch_barrier_warning()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_unbound_barrier(on_gpu, world_size)
        warnings.warn(message, UserWarning, stacklevel=1)
        warnings.warn("barrier(): something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ([] if silenced else [message]) + ["barrier(): something else"]


def test_torchs_deprecation_of_deepspeeds_gather_is_silenced_and_nothing_else(one_rank_world: None) -> None:
    # DeepSpeed's ZeRO gathers its partitions with all_gather_into_tensor, which torch 2.13
    # deprecates; the task log repeated it after every checkpoint. The real call warns here, so a
    # torch that rewords the warning fails this test rather than flooding the logs again.
    gathered = torch.zeros(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.all_gather_into_tensor(gathered, torch.ones(3))
        quiet_deepspeed_gather_deprecation()
        dist.all_gather_into_tensor(gathered, torch.ones(3))
        warnings.warn("`torch.distributed.something_else` is deprecated", FutureWarning, stacklevel=1)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages  # the first gather's, and the other deprecation's
    assert "all_gather_into_tensor" in messages[0] and "something_else" in messages[1]
