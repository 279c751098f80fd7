"""`trainpipe make-data --feast`: labelled transactions, card and merchant features with gaps, a
Feast repo over them; the same bytes for the same seed; labels the features can predict."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.cli import main as trainpipe
from airflow_trainpipe.examples.feast_repo import CARD_MISSING, population, write_feast_example
from airflow_trainpipe.examples.synthetic import Problem

START = date(2026, 1, 1)


def _bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_same_seed_writes_the_same_bytes_and_another_seed_other_rows(tmp_path: Path) -> None:
    first = write_feast_example(tmp_path / "a", START, 2, 400, seed=3, apply=False)
    again = write_feast_example(tmp_path / "b", START, 2, 400, seed=3, apply=False)
    other = write_feast_example(tmp_path / "c", START, 2, 400, seed=4, apply=False)
    data = {k: v for k, v in _bytes(first.root).items() if not k.startswith("repo/")}
    assert data and data == {k: v for k, v in _bytes(again.root).items() if not k.startswith("repo/")}
    assert pq.read_table(first.card_activity) != pq.read_table(other.card_activity)
    assert [f.relative_to(first.root).as_posix() for f in first.transaction_files] == [
        "transactions/ds=2026-01-01/part-00000.parquet",
        "transactions/ds=2026-01-02/part-00000.parquet",
    ]
    # The repo's files differ only by where they are.
    yaml = (first.repo / "feature_store.yaml").read_text()
    assert yaml == (again.repo / "feature_store.yaml").read_text().replace(str(again.root), str(first.root))
    assert "type: duckdb" in yaml and f"path: {first.repo}/online.db" in yaml
    assert repr(str(first.card_activity)) in (first.repo / "features.py").read_text()


def test_the_tables_have_the_documented_shape(tmp_path: Path) -> None:
    example = write_feast_example(tmp_path, START, 3, 2000, seed=1, apply=False)
    rows = pq.read_table(example.transaction_files[0])
    assert str(rows.schema).splitlines() == [
        "transaction_id: string",
        "card_id: int64",
        "merchant_id: int64",
        "event_time: timestamp[us, tz=UTC]",
        "amount: double",
        "channel: string",
        "is_fraud: int64",
    ]
    cards = pq.read_table(example.card_activity).to_pandas()
    assert list(cards.columns) == [
        "card_id",
        "event_timestamp",
        "created",
        "txn_count_7d",
        "amount_mean_7d",
        "amount_max_7d",
        "night_share_30d",
        "declines_7d",
    ]
    n_cards, n_merchants = population(2000)
    days = pd.date_range("2025-12-25", "2026-01-03", freq="D", tz="UTC")
    assert set(cards["event_timestamp"]) == set(days)
    assert 1 - len(cards) / (n_cards * len(days)) == pytest.approx(CARD_MISSING, abs=0.02)
    merchants = pq.read_table(example.merchant_risk).to_pandas()
    assert merchants["merchant_id"].nunique() == n_merchants
    assert merchants["event_timestamp"].diff().dropna().isin([pd.Timedelta(0), pd.Timedelta(days=7)]).all()
    assert population(20_000) == (5000, 500)


def _auc(score: np.ndarray, label: np.ndarray) -> float:
    ranks = pd.Series(score).rank().to_numpy()
    positives = label.sum()
    return float(
        (ranks[label == 1].sum() - positives * (positives + 1) / 2) / (positives * (len(label) - positives))
    )


def test_labels_are_rare_and_the_features_predict_them(tmp_path: Path) -> None:
    example = write_feast_example(tmp_path, START, 2, 20_000, seed=0, apply=False)
    rows = pd.concat(pq.read_table(f).to_pandas() for f in example.transaction_files)
    assert 0.02 <= rows["is_fraud"].mean() <= 0.05
    # Each row with its card's and merchant's latest values (an as-of join by day suffices here).
    cards = pq.read_table(example.card_activity).to_pandas()
    merchants = pq.read_table(example.merchant_risk).to_pandas()
    cards = cards[cards["event_timestamp"].dt.date == START + timedelta(days=1)]
    day = rows[rows["event_time"].dt.date == START + timedelta(days=1)].merge(cards, on="card_id")
    day = day.merge(
        merchants[merchants["event_timestamp"] == merchants["event_timestamp"].max()], on="merchant_id"
    )
    label = day["is_fraud"].to_numpy()
    assert _auc(day["night_share_30d"].to_numpy(), label) > 0.65
    assert _auc(day["merchant_risk_score"].to_numpy(), label) > 0.6
    assert _auc((day["night_share_30d"] + day["merchant_risk_score"]).to_numpy(), label) > 0.7


def test_problems_on_the_keys_and_column_problems_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="card_id, merchant_id, event_time are the keys"):
        write_feast_example(tmp_path, START, 1, 100, problems={START: [Problem.parse("nulls:card_id")]})
    for problem, error in (
        ("2026-01-01=drop:amount", "problem drop:amount: a table's columns are fixed"),
        ("2026-01-01=drift:amount,merchant_id", "merchant_id, event_time are the keys"),
    ):
        assert trainpipe(["make-data", "--feast", str(tmp_path / "x"), "--problem", problem]) == 2
        assert error in capsys.readouterr().err
    assert trainpipe(["make-data", "--feast", str(tmp_path / "x"), "--kind", "house_sales"]) == 2
    assert "not --kind house_sales" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_make_data_feast_writes_an_applied_repo_with_a_problem_day(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "fraud"
    argv = ["make-data", "--feast", str(root), "--days", "2", "--rows", "300", "--seed", "2"]
    assert trainpipe([*argv, "--problem", "2026-01-02=volume:0.5"]) == 0
    out = capsys.readouterr().out
    assert f"{root}/transactions/ds=2026-01-01: 300 row(s), clean" in out
    assert f"{root}/transactions/ds=2026-01-02: 150 row(s), volume:0.5" in out
    assert out.splitlines()[-1] == f"Feast repo (applied): {root}/repo"
    assert (root / "repo" / "registry.db").is_file() and (root / "repo" / "online.db").is_file()
