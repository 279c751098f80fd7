"""The model contract: what a builder is told about its inputs, and the adapter that hands a
model its inputs as a mapping.

Every training and scoring path moves one float32 row per example (runtime.data.transform: the
dense block, the categorical codes, each text input's token ids): one tensor to stream, gather,
cache and export. A builder that takes `inputs` gets a `ModelInputs` and returns a module whose
forward takes the mapping

    {"numeric": (B, D) float, "categorical": (B, C) int64,
     "text": {name: {"input_ids": (B, L) int64, "attention_mask": (B, L) int64,
                     "token_type_ids": (B, L) int64}}}

`MappedInputs` cuts the row into it: ids, codes and masks as integers (never cast to bf16, which
holds integers exactly only up to 256), the dense block in the model's dtype, and each text input
cut to the batch's longest row (dynamic padding) when not exporting. The training step passes
those widths in, counted on the host (`text_widths`): read off the device they would make the
host wait for the GPU at every step before it could queue the next one. A builder without `inputs`
(`tabular_mlp`, plugins written before text) keeps the old call and the flat tensor.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

_exporting = False


@contextmanager
def exporting() -> Iterator[None]:
    """While a model is exported for serving (serving.export_network): what `is_exporting` reads."""
    global _exporting
    before, _exporting = _exporting, True
    try:
        yield
    finally:
        _exporting = before


def is_exporting() -> bool:
    """Whether the model is being exported for serving: the full-width, any-batch path of the
    model code. Not `torch.compiler.is_exporting()`, which Dynamo folds to True in every compiled
    graph on torch before pytorch/pytorch#176499 (2.11, the GPU image's, among them): a job with
    `training.speed.compile` took the export path there, padding every text to max_length and
    dropping the prepared attention mask. A module global, which Dynamo reads when it traces and
    guards, and an export runs as plain Python."""
    return _exporting


@dataclass(frozen=True)
class TextInput:
    name: str
    vocab_size: int
    max_length: int
    pad_id: int
    sep_id: int
    segments: int
    """1, or 2 for a pair of columns (`[CLS] a [SEP] b [SEP]`, segment ids 0 then 1)."""


@dataclass(frozen=True)
class ModelInputs:
    num_numeric: int
    """Width of the dense block (numeric values, one-hot blocks, missing indicators)."""
    cardinalities: list[int]
    """Embedding table size of each categorical code (0: unknown or missing)."""
    text: list[TextInput]

    @classmethod
    def of(cls, transform: Any) -> ModelInputs:
        """The inputs a fitted transform produces (runtime.data.transform.FittedTransform)."""
        return cls(
            transform.num_dense,
            list(transform.cardinalities),
            [
                TextInput(
                    t["name"], t["vocab_size"], t["max_length"], t["pad_id"], t["sep_id"], len(t["columns"])
                )
                for t in transform.text
            ],
        )

    def text_columns(self) -> list[tuple[TextInput, slice]]:
        """Each text input and the columns of the flat row that hold its ids (after the dense
        block and the categorical codes, one text after another)."""
        columns, at = [], self.num_numeric + len(self.cardinalities)
        for text in self.text:
            columns.append((text, slice(at, at + text.max_length)))
            at += text.max_length
        return columns


class MappedInputs(nn.Module):
    """A mapping model behind the flat input row every path feeds."""

    keeps_float32_inputs = True
    """Callers hand it float32 rows (codes and ids exact), whatever the compute dtype."""

    def __init__(self, model: nn.Module, inputs: ModelInputs):
        super().__init__()
        self.model, self.inputs = model, inputs

    def forward(
        self,
        x: torch.Tensor,
        widths: tuple[int, ...] | None = None,
        packed: dict[str, dict[str, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """`widths`: each text input's padded width for this batch (`text_widths`), else counted
        here. `packed`: each text input packed (runtime.models.packing, on the device), which the
        model reads instead of the row's ids."""
        if packed is None:
            return self.model(self.mapping(x, widths))  # type: ignore[no-any-return]
        return self.model({**self.mapping(x, widths, with_text=False), "text": packed})  # type: ignore[no-any-return]

    def mapping(
        self, x: torch.Tensor, widths: tuple[int, ...] | None = None, with_text: bool = True
    ) -> dict[str, Any]:
        numeric, codes = self.inputs.num_numeric, len(self.inputs.cardinalities)
        dtype = next(self.model.parameters()).dtype
        batch: dict[str, Any] = {
            "numeric": x[:, :numeric].to(dtype),
            "categorical": x[:, numeric : numeric + codes].long(),
            "text": {},
        }
        for k, (text, columns) in enumerate(self.inputs.text_columns() if with_text else []):
            ids = x[:, columns]
            if not is_exporting():
                # Dynamic padding: the batch's longest row, not max_length (a text is a prefix of
                # non-pad ids: [CLS] ... [SEP]); an exported program serves any batch at full width.
                longest = (
                    widths[k] if widths is not None else max(1, int((ids != text.pad_id).sum(dim=1).max()))
                )
                ids = ids[:, :longest]
            ids = ids.long()
            mask = ids != text.pad_id
            seps = (ids == text.sep_id).long()
            after_first_sep = (torch.cumsum(seps, dim=1) - seps) >= 1
            batch["text"][text.name] = {
                "input_ids": ids,
                "attention_mask": mask.long(),
                "token_type_ids": (after_first_sep & mask).long(),
            }
        return batch


def text_lengths(x: Any, inputs: ModelInputs) -> Any:
    """Each row's count of non-pad ids per text input, (B, T), from flat host rows (numpy)."""
    import numpy as np

    lengths = np.zeros((len(x), len(inputs.text)), np.int64)
    for k, (text, columns) in enumerate(inputs.text_columns()):
        lengths[:, k] = (x[:, columns] != text.pad_id).sum(axis=1)
    return lengths


def text_widths(lengths: Any, inputs: ModelInputs, multiple: int = 1) -> tuple[int, ...]:
    """The padded width of each text input for a batch with these `text_lengths`: its longest
    row, rounded up to `multiple` (a compiled model sees few shapes), never past max_length."""
    widths = []
    for k, text in enumerate(inputs.text):
        longest = max(1, int(lengths[:, k].max())) if len(lengths) else 1
        widths.append(min(text.max_length, -(-longest // multiple) * multiple))
    return tuple(widths)
