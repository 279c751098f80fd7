"""The holdout, scored in shares: each rank predicts the holdout rows of every W-th block.

The metrics are those of all the holdout's rows (exact, not an average of per-rank metrics),
computed together from each rank's sums and counts (metrics.py), so every rank gets the same
values (early stopping decides on them everywhere alike) and no rank gathers the predictions. The holdout is read again at each
evaluation rather than held: memory is a block and the gathered predictions, not the holdout.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from airflow_trainpipe.runtime.data.blocks import Block, BlockReader
from airflow_trainpipe.runtime.data.prepare import PreparedData
from airflow_trainpipe.runtime.data.tokens import BlockEncoder
from airflow_trainpipe.runtime.engine import PREDICT_BATCH, predict
from airflow_trainpipe.runtime.evaluation.metrics import compute_metrics


def holdout_tables(prepared: PreparedData, reader: BlockReader) -> Iterator[pa.Table]:
    """Every holdout row in block order, one block at a time."""
    for block in prepared.blocks:
        if block.holdout_rows:
            yield reader.parts(block)[1]


def first_holdout_rows(prepared: PreparedData, reader: BlockReader, rows: int) -> pa.Table:
    """The first `rows` holdout rows in block order (the logged predictions and input example)."""
    tables, total = [], 0
    for table in holdout_tables(prepared, reader):
        tables.append(table)
        total += table.num_rows
        if total >= rows:
            break
    return pa.concat_tables(tables, promote_options="permissive").slice(0, rows)


class ShardedHoldout:
    def __init__(
        self,
        prepared: PreparedData,
        reader: BlockReader,
        task: str,
        rank: int = 0,
        world_size: int = 1,
        group: Any = None,
        threshold: Any = 0.5,
        validation: bool = False,
        encoder: BlockEncoder | None = None,
    ):
        """`validation`: score a tuning trial's validation rows instead of the holdout."""
        self.transform, self.reader, self.task = prepared.transform, reader, task
        self.encoder = encoder or BlockEncoder(reader, prepared.transform, prepared.key)
        self.threshold = threshold  # config.evaluation.threshold: a number or a rule
        self.rank, self.world_size, self.group = rank, world_size, group
        self.validation = validation

        def scored(block: Block) -> int:
            return block.validation_rows if validation else block.holdout_rows

        blocks = [b for b in prepared.blocks if scored(b)]
        self.mine = blocks[rank::world_size]
        # ZeRO-3 gathers parameters inside forward: every rank must run as many forwards as the
        # busiest one, so the others pad with one-row forwards whose outputs are dropped.
        self.forwards = max(
            sum(-(-scored(b) // PREDICT_BATCH) for b in blocks[r::world_size]) for r in range(world_size)
        )

    def evaluate(self, engine: Any, device: torch.device, dtype: torch.dtype) -> dict[str, float]:
        """Collective: the holdout (or validation) metrics, the same on every rank."""
        outputs, labels, groups, forwards = [], [], [], 0
        for block in self.mine:
            held, features = self.encoder.side(block, "validation" if self.validation else "holdout")
            outputs.append(predict(engine, features, device, dtype))
            labels.append(self.transform.labels(held))
            if self.task == "ranking":
                groups.append(self.transform.group_codes(held))
            forwards += -(-held.num_rows // PREDICT_BATCH)
        for _ in range(self.forwards - forwards):
            predict(engine, np.zeros((1, self.transform.width), np.float32), device, dtype)
        return self._metrics(outputs, labels, groups)

    def _metrics(
        self, outputs: list[np.ndarray], labels: list[np.ndarray], groups: list[np.ndarray]
    ) -> dict[str, float]:
        # The metrics are sums and counts over rows (metrics.py): each rank contributes its own,
        # in any order, and every rank gets the same values; nothing is gathered to one rank
        # (except for ranking, whose per-query metrics need a query's rows together).
        shape = (0, self.transform.num_outputs) if self.transform.num_outputs > 1 else (0,)
        output = np.concatenate(outputs) if outputs else np.empty(shape, np.float32)
        target = np.concatenate(labels) if labels else np.empty(0, np.float32)
        return compute_metrics(
            self.task,
            self.transform.label_values(target),
            self.transform.predictions(output),
            group=self.group,
            world_size=self.world_size,
            threshold=self.threshold,
            groups=(np.concatenate(groups) if groups else np.empty(0)) if self.task == "ranking" else None,
            classes=self.transform.classes,
        )
