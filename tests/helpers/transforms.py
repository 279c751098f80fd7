"""Fitted transforms of the examples, for tests that need one without a training job."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

    from airflow_trainpipe.runtime.data.transform import FittedTransform


def tickets_transform(tmp_path: Path) -> tuple[FittedTransform, pa.Table]:
    """The support_tickets example's transform (multiclass, text) fitted on 800 tickets, and them."""
    import pyarrow.parquet as pq

    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.examples.synthetic import support_tickets
    from airflow_trainpipe.runtime.data.prepare import fit
    from tests.conftest import EXAMPLE_CONFIGS

    config = parse_config((EXAMPLE_CONFIGS / "support_tickets.yaml").read_text())
    table = support_tickets(date(2026, 1, 1), 800, seed=2)
    pq.write_table(table, tmp_path / "t.parquet")
    uri = (tmp_path / "t.parquet").as_uri()
    return fit([uri], config.data, config.features, config.training.task).transform, table


def small_classifier(transform: FittedTransform) -> torch.nn.Module:
    """A seeded, untrained tabular_mlp (one hidden layer of 8) over `transform`'s classes."""
    import torch

    from airflow_trainpipe.runtime.models import build_model

    torch.manual_seed(0)
    return build_model(
        "tabular_mlp",
        num_numeric=transform.num_dense,
        cardinalities=transform.cardinalities,
        task="multiclass_classification",
        num_outputs=transform.num_outputs,
        hidden_sizes=[8],
    )
