"""Each task's loss on small batches, against the definitions written out row by row."""

from __future__ import annotations

import math

import pytest
import torch

from airflow_trainpipe.runtime.models.losses import listwise_loss, loss_function, pairwise_loss


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scores = torch.tensor([2.0, 0.5, -1.0, 0.3, 0.1, 1.5])
    relevance = torch.tensor([2.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    groups = torch.tensor([7.0, 7.0, 7.0, 9.0, 9.0, 4.0])  # query 9 and 4: nothing relevant
    return scores, relevance, groups


def test_listwise_is_the_softmax_cross_entropy_of_each_query_with_a_relevant_row() -> None:
    scores, relevance, groups = _batch()
    log_p = scores[:3] - torch.logsumexp(scores[:3], 0)
    expected = -(2 / 3 * log_p[0] + 1 / 3 * log_p[2])  # one query counts: the others hold nothing relevant
    assert listwise_loss(scores, relevance, groups).item() == pytest.approx(expected.item(), rel=1e-6)


def test_pairwise_is_the_logistic_loss_of_each_ordered_pair_within_a_query() -> None:
    scores, relevance, groups = _batch()
    s = scores.tolist()
    # Query 7: (row 0 > row 1), (row 0 > row 2), (row 2 > row 1); nothing across queries.
    pairs = [(0, 1), (0, 2), (2, 1)]
    expected = sum(math.log1p(math.exp(-(s[i] - s[j]))) for i, j in pairs) / len(pairs)
    assert pairwise_loss(scores, relevance, groups).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("loss", [listwise_loss, pairwise_loss])
def test_a_batch_with_nothing_to_order_costs_zero_and_still_back_propagates(loss) -> None:
    scores = torch.tensor([0.3, -0.2, 0.9], requires_grad=True)
    value = loss(scores, torch.zeros(3), torch.tensor([1.0, 1.0, 2.0]))
    value.backward()
    assert value.item() == 0.0 and scores.grad is not None and not scores.grad.any()


@pytest.mark.parametrize("loss", [listwise_loss, pairwise_loss])
def test_the_gradient_raises_the_relevant_row(loss) -> None:
    scores = torch.zeros(3, requires_grad=True)
    loss(scores, torch.tensor([0.0, 1.0, 0.0]), torch.zeros(3)).backward()
    assert scores.grad is not None and scores.grad[1] < 0 < scores.grad[0]  # descent raises row 1


def test_each_task_reads_its_outputs_and_targets() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.0], [0.0, 1.0, 3.0]])
    assert loss_function("multiclass_classification")(
        logits, torch.tensor([0.0, 2.0])
    ).item() == pytest.approx(torch.nn.functional.cross_entropy(logits, torch.tensor([0, 2])).item())
    one = torch.tensor([[0.5], [-0.5]])
    assert loss_function("binary_classification")(one, torch.tensor([1.0, 0.0])).item() == pytest.approx(
        math.log1p(math.exp(-0.5))
    )
    assert loss_function("regression")(one, torch.tensor([1.0, 0.0])).item() == pytest.approx(0.25)
    targets = torch.tensor([[1.0, 3.0], [0.0, 3.0]])  # (relevance, group code)
    assert loss_function("ranking", "pairwise")(one, targets).item() == pytest.approx(
        math.log1p(math.exp(-1.0))
    )


def test_pairwise_builds_the_pairs_of_each_query_not_of_the_whole_micro_batch() -> None:
    """4,096 rows in queries of 8: 32,768 pairs, where a batch-by-batch mask holds 16.8M entries.
    The loss is the one over every ordered pair of a query, written out with that mask."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(tensor, torch.Tensor):
                    self.numel = max(self.numel, tensor.numel())
            return out

    generator = torch.Generator().manual_seed(0)
    rows = 4096
    scores = torch.randn(rows, generator=generator)
    relevance = torch.randint(0, 3, (rows,), generator=generator).float()
    groups = torch.repeat_interleave(torch.randperm(rows // 8, generator=generator).float(), 8)
    with Largest() as largest:
        value = pairwise_loss(scores, relevance, groups)
    assert largest.numel <= rows * 8
    every = (groups[:, None] == groups[None, :]) & (relevance[:, None] > relevance[None, :])
    expected = torch.nn.functional.softplus(scores[None, :] - scores[:, None])[every].mean()
    assert value.item() == pytest.approx(expected.item(), rel=1e-5)
