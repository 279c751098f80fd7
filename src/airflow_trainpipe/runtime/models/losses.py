"""The training loss of each task, on a micro-batch of network outputs and targets.

Ranking targets are two columns, (relevance, group code): the stream keeps a group's rows next to
each other (runtime/data/stream.py), so a micro-batch holds whole groups, or the parts of one or two
groups cut at its edges, and each loss compares rows of one group only. A micro-batch without a
relevant row (or, pairwise, without a pair of different relevance) contributes zero: the gradient
of an all-irrelevant query carries no ordering to learn.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def loss_function(task: str, ranking_loss: str = "listwise") -> Loss:
    """`outputs`: (batch, outputs) float32; `targets`: as the stream stores them for `task`."""
    if task == "binary_classification":
        return lambda outputs, y: F.binary_cross_entropy_with_logits(outputs[:, 0], y)
    if task == "multiclass_classification":
        return lambda outputs, y: F.cross_entropy(outputs, y.long())
    if task == "ranking":
        ranked = pairwise_loss if ranking_loss == "pairwise" else listwise_loss
        return lambda outputs, y: ranked(outputs[:, 0], y[:, 0], y[:, 1])
    return lambda outputs, y: F.mse_loss(outputs[:, 0], y)


def listwise_loss(scores: torch.Tensor, relevance: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """ListNet's top-one cross-entropy: per group, the softmax of the scores against the relevance
    normalised to sum 1, averaged over the groups that hold a relevant row."""
    _, group = torch.unique(groups, return_inverse=True)
    count = int(group.max()) + 1 if len(group) else 0
    # Per-group log-softmax, shifted by each group's largest score (exp cannot overflow).
    top = torch.full((count,), -torch.inf, dtype=scores.dtype, device=scores.device)
    top = top.scatter_reduce(0, group, scores.detach(), "amax")
    shifted = scores - top[group]
    total = torch.zeros(count, dtype=scores.dtype, device=scores.device).index_add(0, group, shifted.exp())
    log_p = shifted - total.log()[group]
    relevant = torch.zeros(count, dtype=scores.dtype, device=scores.device).index_add(0, group, relevance)
    target = relevance / relevant[group].clamp_min(1e-12)  # zero in a group with no relevant row
    return -(target * log_p).sum() / (relevant > 0).sum().clamp_min(1)


def pairwise_loss(scores: torch.Tensor, relevance: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """RankNet: the logistic loss of every ordered pair of one group where the first row is more
    relevant, averaged over those pairs. Only pairs within a group are built (the sum of the
    groups' squared sizes), never the micro-batch squared: a group's rows are side by side."""
    size = len(groups)
    if size == 0:
        return (scores * 0).sum()
    starts = torch.ones(size, dtype=torch.bool, device=groups.device)
    starts[1:] = groups[1:] != groups[:-1]
    run = torch.cumsum(starts.long(), 0) - 1  # each row's run of one group code
    first = torch.nonzero(starts).squeeze(1)  # where each run starts
    lengths = torch.diff(torch.cat([first, first.new_tensor([size])]))
    per_row = lengths[run]  # the pairs each row is the first of
    i = torch.repeat_interleave(torch.arange(size, device=groups.device), per_row)
    offset = torch.arange(len(i), device=groups.device) - torch.repeat_interleave(
        torch.cumsum(per_row, 0) - per_row, per_row
    )
    j = first[run[i]] + offset
    ordered = relevance[i] > relevance[j]
    if not bool(ordered.any()):
        return (scores * 0).sum()
    return F.softplus(scores[j] - scores[i])[ordered].mean()
