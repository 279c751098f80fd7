"""`tabular_mlp`: embeddings for categorical columns, an MLP on top; one output."""

from __future__ import annotations

import torch
from torch import nn


class TabularMLP(nn.Module):
    def __init__(self, num_numeric: int, cardinalities: list[int], hidden_sizes: list[int], dropout: float):
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
        layers.append(nn.Linear(width, 1))
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
) -> TabularMLP:
    del task  # one output serves both: a logit (binary) or a standardised value (regression)
    return TabularMLP(num_numeric, list(cardinalities), [int(h) for h in hidden_sizes], float(dropout))
