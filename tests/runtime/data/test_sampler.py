from __future__ import annotations

import pytest

from airflow_trainpipe.core.exceptions import TrainingJobError
from airflow_trainpipe.runtime.data.sampler import ResumableSampler


def _global_batches(world_size: int, steps: int, accumulation: int = 1) -> list[list[int]]:
    samplers = [
        ResumableSampler(100, 12, accumulation, world_size, rank, seed=3) for rank in range(world_size)
    ]
    batches = []
    for _ in range(steps):
        per_rank = [s.step_positions() for s in samplers]
        assert len({global_range for global_range, _ in per_rank}) == 1  # every rank loads the same chunks
        # Micro-batch k of every rank together make micro-batch k of the global batch.
        batches.append([i for k in range(accumulation) for _, ranges in per_rank for i in range(*ranges[k])])
    return batches


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_global_batches_do_not_depend_on_world_size(world_size: int) -> None:
    assert _global_batches(world_size, 8) == _global_batches(1, 8)
    assert _global_batches(world_size, 4, accumulation=2) == _global_batches(1, 4, accumulation=2)
    # Global batch k is positions [12k, 12k + 12) of the epoch's stream, each taken once.
    assert _global_batches(world_size, 8) == [list(range(12 * k, 12 * k + 12)) for k in range(8)]


def test_resume_from_state_continues_the_same_order() -> None:
    straight = ResumableSampler(100, 12, 1, 2, 1, seed=3)
    expected = [straight.step_positions() for _ in range(6)]
    first = ResumableSampler(100, 12, 1, 2, 1, seed=3)
    got = [first.step_positions() for _ in range(3)]
    resumed = ResumableSampler(100, 12, 1, 2, 1, seed=3)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.step_positions() for _ in range(3)]
    assert got == expected


def test_an_epoch_drops_the_incomplete_batch_and_the_next_starts_over() -> None:
    sampler = ResumableSampler(100, 12, 1, 1, 0, seed=3)
    assert sampler.steps_per_epoch == 8
    for _ in range(8):
        sampler.step_positions()
    assert sampler.epoch_done()
    sampler.next_epoch()
    assert (sampler.epoch, sampler.step_positions()[0]) == (1, (0, 12))


def test_world_size_that_does_not_divide_the_global_batch_is_refused() -> None:
    with pytest.raises(TrainingJobError, match="global batch 12 does not split into 1 micro-batch"):
        ResumableSampler(100, 12, 1, 5, 0, seed=3)


def test_state_from_another_batch_size_is_refused() -> None:
    sampler = ResumableSampler(100, 12, 1, 1, 0, seed=3)
    with pytest.raises(TrainingJobError, match="does not match global batch 12"):
        sampler.load_state_dict({"epoch": 0, "consumed": 24, "global_batch": 24, "seed": 3})
