"""Per-slice scoring of the final evaluation: names, rows and metrics of each slice."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from airflow_trainpipe.config.evaluation import Slice
from airflow_trainpipe.runtime.evaluation.metrics import compute_metrics
from airflow_trainpipe.runtime.evaluation.slices import slice_names, slice_scores

BINARY = "binary_classification"


def _tables() -> list[pa.Table]:
    # Two tables, as the holdout streams block by block; nulls in both columns.
    return [
        pa.table({"channel": ["web", None, "pos"], "amount": [5.0, 10.0, None]}),
        pa.table({"channel": ["web", "atm", "pos"], "amount": [99.5, 100.0, 2500.0]}),
    ]


def test_a_categorical_slice_is_a_value_and_a_missing_one_its_own() -> None:
    names = slice_names(_tables(), Slice(column="channel"))
    assert names.tolist() == ["web", "(missing)", "pos", "web", "atm", "pos"]


def test_a_numeric_slice_is_a_bin_between_edges() -> None:
    names = slice_names(_tables(), Slice(column="amount", bins=[10, 100]))
    assert names.tolist() == ["< 10", "[10, 100)", "(missing)", "[10, 100)", ">= 100", ">= 100"]


def test_integer_codes_slice_by_their_value() -> None:
    names = slice_names(
        [pa.table({"region": pa.array([3, None, 3, 12], pa.int64())})], Slice(column="region")
    )
    assert names.tolist() == ["3", "(missing)", "3", "12"]


def test_each_slice_scores_both_models_on_its_rows_at_their_whole_holdout_thresholds() -> None:
    rng = np.random.default_rng(0)
    n = 600
    channel = rng.choice(["web", "pos", "atm"], n)
    table = pa.table({"channel": channel})
    labels = (rng.random(n) < 0.3).astype(float)
    ours, theirs = rng.random(n), rng.random(n)
    scores = slice_scores(
        BINARY,
        [Slice(column="channel")],
        lambda: [table.slice(0, 250), table.slice(250)],
        labels,
        (ours, 0.4),
        (theirs, 0.6),
    )
    assert [s["slice"] for s in scores] == ["channel=atm", "channel=pos", "channel=web"]
    for score in scores:
        rows = channel == score["slice"].removeprefix("channel=")
        assert score["rows"] == rows.sum()
        assert score["candidate"] == compute_metrics(BINARY, labels[rows], ours[rows], threshold=0.4)
        assert score["champion"] == compute_metrics(BINARY, labels[rows], theirs[rows], threshold=0.6)
        assert score["candidate"]["threshold"] == 0.4


def test_without_a_champion_only_the_candidate_is_scored() -> None:
    table = pa.table({"amount": [1.0, 50.0, 500.0, 700.0]})
    scores = slice_scores(
        "regression",
        [Slice(column="amount", bins=[100])],
        lambda: [table],
        np.array([1.0, 2.0, 3.0, 4.0]),
        (np.array([1.0, 2.5, 3.0, 5.0]), 0.5),
        None,
    )
    assert [(s["slice"], s["rows"], s["champion"]) for s in scores] == [
        ("amount=< 100", 2, None),
        ("amount=>= 100", 2, None),
    ]
    assert scores[1]["candidate"]["mae"] == pytest.approx(0.5)
