"""`text_encoder`: a small transformer encoder per text input (BERT's architecture, built from a
config: no download), the [CLS] states joined with the tabular features in an MLP head.

Its size is `training.hyperparameters.model_args` (`hidden_size`, `num_layers`, `num_heads`,
`intermediate_size`, `max_position_embeddings`, `dropout`, `head_hidden_sizes`), tunable like
any hyperparameter. One output, or one logit per class (multiclass).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from airflow_trainpipe.runtime.models.inputs import ModelInputs


class TextEncoder(nn.Module):
    def __init__(
        self,
        inputs: ModelInputs,
        num_outputs: int,
        hidden_size: int,
        num_layers: int,
        num_heads: int,
        intermediate_size: int,
        max_position_embeddings: int,
        dropout: float,
        head_hidden_sizes: list[int],
    ):
        from transformers import BertConfig, BertModel

        super().__init__()
        self.encoders = nn.ModuleDict(
            {
                text.name: BertModel(
                    BertConfig(
                        vocab_size=text.vocab_size,
                        hidden_size=hidden_size,
                        num_hidden_layers=num_layers,
                        num_attention_heads=num_heads,
                        intermediate_size=intermediate_size,
                        max_position_embeddings=max_position_embeddings,
                        type_vocab_size=2,
                        pad_token_id=text.pad_id,
                        hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout,
                    ),
                    add_pooling_layer=False,
                )
                for text in inputs.text
            }
        )
        dims = [min(16, (c + 1) // 2 + 1) for c in inputs.cardinalities]
        self.embeddings = nn.ModuleList(
            nn.Embedding(c, d) for c, d in zip(inputs.cardinalities, dims, strict=True)
        )
        width = inputs.num_numeric + sum(dims) + hidden_size * len(inputs.text)
        layers: list[nn.Module] = []
        for size in head_hidden_sizes:
            layers += [nn.Linear(width, size), nn.GELU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = size
        layers.append(nn.Linear(width, num_outputs))
        self.head = nn.Sequential(*layers)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        parts = [batch["numeric"]]
        codes = batch["categorical"]
        parts += [embedding(codes[:, i]) for i, embedding in enumerate(self.embeddings)]
        for name, encoder in self.encoders.items():
            states = encoder(**batch["text"][name]).last_hidden_state
            parts.append(states[:, 0])  # the [CLS] token's state
        return self.head(torch.cat(parts, dim=1))  # type: ignore[no-any-return]


def build_text_encoder(
    *,
    inputs: ModelInputs,
    task: str,
    num_outputs: int = 1,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    dropout: float = 0.1,
    head_hidden_sizes: list[int] | tuple[int, ...] = (64,),
) -> TextEncoder:
    del task  # in num_outputs already, as for tabular_mlp
    if not inputs.text:
        raise ValueError("text_encoder needs at least one text input (data.features.text)")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_heads {num_heads}")
    return TextEncoder(
        inputs,
        int(num_outputs),
        int(hidden_size),
        int(num_layers),
        int(num_heads),
        int(intermediate_size or 4 * hidden_size),
        int(max_position_embeddings),
        float(dropout),
        [int(h) for h in head_hidden_sizes],
    )
