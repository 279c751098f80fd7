from __future__ import annotations

import pytest
import torch

from airflow_trainpipe.exceptions import TrainingJobError
from airflow_trainpipe.runtime.sampler import ResumableSampler


def _global_batches(world_size: int, steps: int, accumulation: int = 1) -> list[list[int]]:
    samplers = [
        ResumableSampler(100, 12, accumulation, world_size, rank, seed=3) for rank in range(world_size)
    ]
    batches = []
    for _ in range(steps):
        per_rank = [s.step_batches() for s in samplers]
        # Micro-batch k of every rank together make micro-batch k of the global batch.
        batches.append([int(i) for k in range(accumulation) for rank in per_rank for i in rank[k]])
    return batches


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_global_batches_do_not_depend_on_world_size(world_size: int) -> None:
    assert _global_batches(world_size, 8) == _global_batches(1, 8)
    assert _global_batches(world_size, 4, accumulation=2) == _global_batches(1, 4, accumulation=2)


def test_resume_from_state_continues_the_same_order() -> None:
    straight = ResumableSampler(100, 12, 1, 2, 0, seed=3)
    expected = [straight.step_batches()[0].tolist() for _ in range(6)]
    first = ResumableSampler(100, 12, 1, 2, 0, seed=3)
    got = [first.step_batches()[0].tolist() for _ in range(3)]
    resumed = ResumableSampler(100, 12, 1, 2, 0, seed=3)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.step_batches()[0].tolist() for _ in range(3)]
    assert got == expected


def test_epochs_reshuffle_and_drop_the_incomplete_batch() -> None:
    sampler = ResumableSampler(100, 12, 1, 1, 0, seed=3)
    assert sampler.steps_per_epoch == 8
    epoch0 = torch.cat([sampler.step_batches()[0] for _ in range(8)])
    assert sampler.epoch_done() and len(set(epoch0.tolist())) == 96
    sampler.next_epoch()
    assert not torch.equal(sampler.step_batches()[0], epoch0[:12])


def test_world_size_that_does_not_divide_the_global_batch_is_refused() -> None:
    with pytest.raises(TrainingJobError, match="global batch 12 does not split into 1 micro-batch"):
        ResumableSampler(100, 12, 1, 5, 0, seed=3)


def test_state_from_another_batch_size_is_refused() -> None:
    sampler = ResumableSampler(100, 12, 1, 1, 0, seed=3)
    with pytest.raises(TrainingJobError, match="does not match global batch 12"):
        sampler.load_state_dict({"epoch": 0, "consumed": 24, "global_batch": 24, "seed": 3})
