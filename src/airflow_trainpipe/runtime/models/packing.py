"""Sequence packing (`training.speed.packing`): a micro-batch's texts laid one after another into
as few rows as fit, so the encoder computes on tokens, not on padding.

Dynamic padding pads every text of a micro-batch to its longest; with short texts beside long
ones most of the encoder's work is padding. Packing places each text's tokens into rows of that
same width (first fit, longest first), restarts the position ids at each text, and gives the
encoder a block-diagonal attention mask: a token attends to its own text's tokens alone, so each
text's [CLS] state is the one it would have had alone in a padded row (up to float rounding).
Everything is decided on the host from the host rows, before the micro-batch reaches the device:
the step never waits for the device to learn a shape.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from airflow_trainpipe.runtime.models.inputs import ModelInputs


@dataclass(frozen=True)
class PackedText:
    """One text input of a micro-batch, packed. Arrays of (rows, width) unless said otherwise."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    position_ids: np.ndarray
    segments: np.ndarray
    """Which text of the micro-batch a token is (its row number + 1); 0 on padding."""
    cls_index: np.ndarray
    """(micro-batch rows,): where each text's first token sits in the flattened (rows x width)."""

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "input_ids": self.input_ids,
            "token_type_ids": self.token_type_ids,
            "position_ids": self.position_ids,
            "segments": self.segments,
            "cls_index": self.cls_index,
        }


def pack_rows(lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, int]:
    """First fit decreasing: for texts of `lengths` (each at most `width`), the packed row and
    offset of each, and how many packed rows there are."""
    row_of = np.zeros(len(lengths), np.int64)
    offset_of = np.zeros(len(lengths), np.int64)
    free: list[tuple[int, int]] = []  # (room left, row), sorted: the fullest row that fits is first
    rows = 0
    for i in np.argsort(-lengths, kind="stable"):
        need = int(lengths[i])
        at = bisect.bisect_left(free, (need, -1))
        if at < len(free):
            room, row = free.pop(at)
        else:
            room, row, rows = width, rows, rows + 1
        row_of[i], offset_of[i] = row, width - room
        if room - need > 0:
            bisect.insort(free, (room - need, row))
    return row_of, offset_of, rows


def pack_text(x: np.ndarray, inputs: ModelInputs, lengths: np.ndarray) -> dict[str, PackedText]:
    """Each text input of the flat host rows `x`, packed into rows of the micro-batch's longest
    text (`lengths`: `text_lengths(x, inputs)`)."""
    packed = {}
    for k, (text, columns) in enumerate(inputs.text_columns()):
        ids = x[:, columns].astype(np.int64)
        # An all-pad text keeps its first id, as padded.
        length = np.maximum(lengths[:, k].astype(np.int64), 1)
        width = max(1, int(length.max())) if len(length) else 1
        row_of, offset_of, rows = pack_rows(length, width)
        # A text is a prefix of non-pad ids, so its tokens in row order are the mask's True cells.
        tokens = np.arange(ids.shape[1])[None, :] < length[:, None]
        seps = ids == text.sep_id
        segment_type = ((np.cumsum(seps, axis=1) - seps) >= 1).astype(np.int64)
        starts = np.cumsum(length) - length  # where each text starts among all tokens
        within = np.arange(int(length.sum())) - np.repeat(starts, length)
        target = np.repeat(row_of * width + offset_of, length) + within
        shape = (rows, width)
        input_ids = np.full(rows * width, text.pad_id, np.int64)
        token_type_ids = np.zeros(rows * width, np.int64)
        position_ids = np.zeros(rows * width, np.int64)
        segments = np.zeros(rows * width, np.int64)
        input_ids[target] = ids[tokens]
        token_type_ids[target] = segment_type[tokens]
        position_ids[target] = within
        segments[target] = np.repeat(np.arange(1, len(length) + 1), length)
        packed[text.name] = PackedText(
            input_ids.reshape(shape),
            token_type_ids.reshape(shape),
            position_ids.reshape(shape),
            segments.reshape(shape),
            row_of * width + offset_of,
        )
    return packed
