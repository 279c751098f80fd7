"""Seeding and saving/restoring every generator a training process draws from."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from airflow_trainpipe.runtime.resume.seeding import restore_rng_state, rng_state, seed_everything


def _draws() -> tuple[float, float, float, list[int], list[float]]:
    """A mix of draws from every generator: uniforms, a permutation, Gaussians."""
    return (
        random.random(),
        float(np.random.rand()),
        torch.rand(1).item(),
        torch.randperm(10).tolist(),
        [random.gauss(0, 1), float(np.random.standard_normal()), torch.randn(1).item()],
    )


def test_the_same_seed_gives_the_same_draws_from_every_generator() -> None:
    seed_everything(123)
    first = _draws()
    seed_everything(123)
    assert _draws() == first
    seed_everything(124)
    second = _draws()
    assert all(a != b for a, b in zip(first[:3], second[:3], strict=True))  # each generator is seeded


def test_a_restored_state_replays_the_draws_made_after_it_was_taken() -> None:
    seed_everything(7)
    _draws()  # mid-stream, as in a checkpoint after some steps
    state = rng_state()
    expected = [_draws() for _ in range(50)]
    seed_everything(999)  # the retry seeds everything first, as the job does, then restores
    restore_rng_state(state)
    assert [_draws() for _ in range(50)] == expected


def test_a_half_used_gaussian_pair_is_part_of_the_state() -> None:
    """numpy's legacy generator and Python's `random.gauss` cache the second value of each pair."""
    seed_everything(11)
    random.gauss(0, 1)
    np.random.standard_normal()
    state = rng_state()
    assert state["numpy"]["has_gauss"] == 1 and state["python"]["gauss"] is not None
    expected = (random.gauss(0, 1), float(np.random.standard_normal()))
    seed_everything(11)  # same underlying stream position minus the cached value
    restore_rng_state(state)
    assert (random.gauss(0, 1), float(np.random.standard_normal())) == expected


def test_the_state_holds_only_tensors_and_plain_values() -> None:
    """Checkpoints load weights-only, which refuses numpy arrays and other pickled objects."""
    state = rng_state()

    def leaves(value: object) -> list[object]:
        if isinstance(value, dict):
            return [leaf for item in value.values() for leaf in leaves(item)]
        return [value]

    kinds = {type(leaf) for leaf in leaves(state)}
    assert kinds <= {torch.Tensor, int, float, str, type(None)}, kinds
    assert state["numpy"]["keys"].dtype == torch.int64 and state["numpy"]["keys"].shape == (624,)
    assert state["python"]["state"].dtype == torch.int64 and state["python"]["state"].shape == (625,)


def test_a_taken_state_is_a_snapshot_that_later_draws_do_not_change() -> None:
    seed_everything(5)
    state = rng_state()
    saved_torch, saved_keys = state["torch"].clone(), state["numpy"]["keys"].clone()
    _draws()
    assert torch.equal(state["torch"], saved_torch) and torch.equal(state["numpy"]["keys"], saved_keys)
    assert not torch.equal(torch.get_rng_state(), saved_torch)  # the live generator did move on


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only state")
def test_a_cpu_process_saves_no_cuda_state_and_restores_without_one() -> None:
    seed_everything(3)
    state = rng_state()
    assert state["cuda"] is None
    expected = torch.rand(3)
    restore_rng_state({k: v for k, v in state.items() if k != "cuda"})
    assert torch.equal(torch.rand(3), expected)
