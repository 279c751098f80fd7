"""`tabular_mlp`: embeddings for categorical columns, an MLP on top; one output, or one per class."""

from __future__ import annotations

import torch
from torch import nn


class TabularMLP(nn.Module):
    def __init__(
        self,
        num_numeric: int,
        cardinalities: list[int],
        hidden_sizes: list[int],
        dropout: float,
        num_outputs: int = 1,
    ):
        super().__init__()
        self.num_numeric = num_numeric
        dims = [min(16, (c + 1) // 2 + 1) for c in cardinalities]
        self.embeddings = nn.ModuleList(nn.Embedding(c, d) for c, d in zip(cardinalities, dims, strict=True))
        width = num_numeric + sum(dims)
        layers: list[nn.Module] = []
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = size
        layers.append(nn.Linear(width, num_outputs))
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Categorical codes travel as floats so the model has a single tensor input (simple to
        # export and to serve); they are exact small integers.
        numeric = x[:, : self.num_numeric]
        parts = [numeric]
        for i, embedding in enumerate(self.embeddings):
            parts.append(embedding(x[:, self.num_numeric + i].long()))
        return self.mlp(torch.cat(parts, dim=1))


def build_tabular_mlp(
    *,
    num_numeric: int,
    cardinalities: list[int],
    task: str,
    hidden_sizes: list[int] | tuple[int, ...] = (64, 32),
    dropout: float = 0.0,
    num_outputs: int = 1,
) -> TabularMLP:
    # The task is in num_outputs already: a logit (binary), a standardised value (regression) or
    # a score (ranking) is one output; multiclass has one logit per class.
    del task
    return TabularMLP(
        num_numeric, list(cardinalities), [int(h) for h in hidden_sizes], float(dropout), int(num_outputs)
    )
