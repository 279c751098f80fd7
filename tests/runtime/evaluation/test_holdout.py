"""Holdout scoring in shares: the metrics of all holdout rows, the same on 1, 2 and 3 real gloo
ranks, with every rank running as many forwards as the busiest (ZeRO-3 needs that)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from airflow_trainpipe.config import load_config
from airflow_trainpipe.examples.synthetic import transactions
from airflow_trainpipe.runtime import engine as engine_module
from airflow_trainpipe.runtime.data.blocks import BlockReader
from airflow_trainpipe.runtime.data.prepare import PreparedData, fit
from airflow_trainpipe.runtime.data.reader import data_columns
from airflow_trainpipe.runtime.evaluation.holdout import ShardedHoldout, first_holdout_rows, holdout_tables
from airflow_trainpipe.runtime.evaluation.metrics import compute_metrics
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.ranks import run_ranks

CONFIG = load_config(EXAMPLE_CONFIGS / "fraud_detector.yaml")
TASK = "binary_classification"


class CountingNetwork(torch.nn.Module):
    """A fixed linear scorer that counts its forwards."""

    def __init__(self, width: int):
        super().__init__()
        torch.manual_seed(3)
        self.linear = torch.nn.Linear(width, 1)
        self.forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return self.linear(x)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], PreparedData]:
    """3100 rows in 100-row row groups: 31 blocks, which 2 or 3 ranks cannot share evenly."""
    root = tmp_path_factory.mktemp("holdout")
    pq.write_table(transactions(date(2026, 1, 1), 3100, seed=6), root / "part.parquet", row_group_size=100)
    files = [(root / "part.parquet").as_uri()]
    return files, fit(files, CONFIG.data, CONFIG.features, TASK)


def _scorer(files: list[str], prepared: PreparedData, rank: int = 0, world_size: int = 1) -> ShardedHoldout:
    reader = BlockReader(files, prepared.identities, CONFIG.data, data_columns(CONFIG.data))
    return ShardedHoldout(prepared, reader, TASK, rank, world_size)


def test_one_rank_scores_every_holdout_row_in_block_order(
    snapshot: tuple[list[str], PreparedData], monkeypatch: pytest.MonkeyPatch
) -> None:
    files, prepared = snapshot
    monkeypatch.setattr(engine_module, "PREDICT_BATCH", 64)
    scorer = _scorer(files, prepared)
    network = CountingNetwork(scorer.transform.width)
    metrics = scorer.evaluate(network, torch.device("cpu"), torch.float32)
    held = pa.concat_tables(list(holdout_tables(prepared, scorer.reader)))
    assert held.num_rows == prepared.holdout_rows
    transform = prepared.transform
    with torch.no_grad():
        outputs = network(torch.from_numpy(transform.features(held))).squeeze(1).double().numpy()
    expected = compute_metrics(
        TASK, transform.label_values(transform.labels(held)), transform.predictions(outputs)
    )
    assert metrics == pytest.approx(expected, rel=1e-6)
    assert first_holdout_rows(prepared, scorer.reader, 50) == held.slice(0, 50)


def _rank_worker(
    store: str, rank: int, world_size: int, prepared_file: str, files: list[str], out: str
) -> None:
    import torch.distributed as dist

    engine_module.PREDICT_BATCH = 64
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    prepared = PreparedData.from_json(Path(prepared_file).read_text())
    scorer = _scorer(files, prepared, rank, world_size)
    network = CountingNetwork(scorer.transform.width)
    metrics = scorer.evaluate(network, torch.device("cpu"), torch.float32)
    Path(out).write_text(
        json.dumps({"metrics": metrics, "forwards": network.forwards, "blocks": len(scorer.mine)})
    )
    dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_score_their_share_and_agree_on_the_metrics_of_all_rows(
    snapshot: tuple[list[str], PreparedData], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, world_size: int
) -> None:
    files, prepared = snapshot
    monkeypatch.setattr(engine_module, "PREDICT_BATCH", 64)
    alone = _scorer(files, prepared)
    expected = alone.evaluate(CountingNetwork(alone.transform.width), torch.device("cpu"), torch.float32)
    outs = run_ranks(tmp_path, _rank_worker, files, prepared, world_size, ".json")
    results = [json.loads(out.read_text()) for out in outs]
    assert all(r["metrics"] == results[0]["metrics"] for r in results)  # every rank alike, exactly
    # The same metrics as one rank scoring every row: counts exactly, sums up to their order.
    assert results[0]["metrics"] == pytest.approx(expected, rel=1e-12)
    assert sum(r["blocks"] for r in results) == len([b for b in prepared.blocks if b.holdout_rows])
    assert len({r["forwards"] for r in results}) == 1  # padded to the busiest rank's count
    assert np.all([r["blocks"] < 31 for r in results])
