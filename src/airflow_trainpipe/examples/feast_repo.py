"""The feature-store example: card transactions whose label comes with no features but keys, and
the features in a Feast repo (`trainpipe make-data --feast DIR`).

- `DIR/transactions/ds=YYYY-MM-DD/part-00000.parquet`: the entity rows (the labels), the layout of
  `--out`: `transaction_id`, `card_id`, `merchant_id`, `event_time` (UTC, spread over the day),
  `amount`, `channel`, `is_fraud`.
- `DIR/features/card_activity.parquet`: one row per card per day (00:00 UTC) from 7 days before
  the first day to the last, about 10% of card-days missing, so with the view's 2-day TTL some
  transactions have no card value: a correct as-of join gives nulls there, not fewer rows.
- `DIR/features/merchant_risk.parquet`: one row per merchant per week (30-day TTL).
- `DIR/repo/`: `feature_store.yaml` (DuckDB offline store, SQLite online store, absolute paths)
  and `features.py`, applied with the Feast interpreter (`feature_store.client.feast_python`).

Every card and merchant has a latent risk that drives both its feature values and the fraud
probability (with the amount and channel), so a model trained on the joined features learns.
Everything is a function of (seed, start, days, rows): the same call writes the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_trainpipe.examples.synthetic import (
    CHANNELS,
    Problem,
    inject,
    refuse_column_problems,
    with_event_time,
)

PROJECT = "trainpipe_fraud"
FEATURE_SERVICE = "fraud_features"
CARD_FEATURES = ("txn_count_7d", "amount_mean_7d", "amount_max_7d", "night_share_30d", "declines_7d")
MERCHANT_FEATURES = ("chargeback_rate_30d", "merchant_risk_score")
CARD_HISTORY_DAYS = 7  # card features start this many days before the first transactions
MERCHANT_HISTORY_DAYS = 28
CARD_MISSING = 0.10  # share of card-days without a feature row
_TS = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class FeastExample:
    """Where `write_feast_example` put things."""

    root: Path
    transactions: Path  # the dataset root of the daily partitions
    transaction_files: tuple[Path, ...]
    card_activity: Path
    merchant_risk: Path
    repo: Path


def population(rows: int) -> tuple[int, int]:
    """(cards, merchants) for `rows` transactions a day: 5,000 and 500 at the default 20,000."""
    return max(20, rows // 4), max(5, rows // 40)


def latent_risk(seed: int, cards: int, merchants: int) -> tuple[np.ndarray, np.ndarray]:
    """Each card's and each merchant's risk in [0, 1): the same every day."""
    rng = np.random.default_rng([seed, 11])
    return rng.beta(1.5, 6.0, cards), rng.beta(1.5, 6.0, merchants)


def _midnights(first: date, last: date, step: int = 1) -> list[datetime]:
    days = (last - first).days
    return [
        datetime(first.year, first.month, first.day, tzinfo=UTC) + timedelta(days=d)
        for d in range(0, days + 1, step)
    ]


def card_activity(seed: int, start: date, last: date, rows: int) -> pa.Table:
    """Daily card aggregates from `CARD_HISTORY_DAYS` before `start` to `last`, by day then card."""
    cards, merchants = population(rows)
    risk, _ = latent_risk(seed, cards, merchants)
    days = _midnights(start - timedelta(days=CARD_HISTORY_DAYS), last)
    rng = np.random.default_rng([seed, 12, start.toordinal()])
    n = len(days) * cards
    card = np.tile(np.arange(cards, dtype=np.int64), len(days))
    r = risk[card]
    times = np.repeat(np.array([d.replace(tzinfo=None) for d in days], dtype="datetime64[us]"), cards)
    mean = np.round(rng.lognormal(3.4 + 1.2 * r, 0.25, n), 2)
    keep = rng.random(n) >= CARD_MISSING
    table = pa.table(
        {
            "card_id": card,
            "event_timestamp": pa.array(times, _TS),
            "created": pa.array(times + np.timedelta64(3, "h"), _TS),
            "txn_count_7d": rng.poisson(4 + 25 * r).astype(np.int64),
            "amount_mean_7d": mean,
            "amount_max_7d": np.round(mean * (1 + rng.exponential(1.0 + 2 * r, n)), 2),
            "night_share_30d": np.round(np.clip(0.08 + 0.7 * r + rng.normal(0, 0.05, n), 0, 1), 4),
            "declines_7d": rng.poisson(0.1 + 3 * r).astype(np.int64),
        }
    )
    return table.filter(pa.array(keep))


def merchant_risk(seed: int, start: date, last: date, rows: int) -> pa.Table:
    """Weekly merchant aggregates from `MERCHANT_HISTORY_DAYS` before `start` to `last`."""
    cards, merchants = population(rows)
    _, risk = latent_risk(seed, cards, merchants)
    weeks = _midnights(start - timedelta(days=MERCHANT_HISTORY_DAYS), last, step=7)
    rng = np.random.default_rng([seed, 13, start.toordinal()])
    n = len(weeks) * merchants
    merchant = np.tile(np.arange(merchants, dtype=np.int64), len(weeks))
    r = risk[merchant]
    times = np.repeat(np.array([w.replace(tzinfo=None) for w in weeks], dtype="datetime64[us]"), merchants)
    return pa.table(
        {
            "merchant_id": merchant,
            "event_timestamp": pa.array(times, _TS),
            "created": pa.array(times + np.timedelta64(3, "h"), _TS),
            "chargeback_rate_30d": np.round(np.clip(0.002 + 0.06 * r + rng.normal(0, 0.004, n), 0, 1), 5),
            "merchant_risk_score": np.round(np.clip(r + rng.normal(0, 0.05, n), 0, 1), 4),
        }
    )


def transactions(day: date, rows: int, seed: int) -> pa.Table:
    """One day's labelled transactions: keys, time, amount, channel and `is_fraud` (about 3%)."""
    cards, merchants = population(rows)
    card_r, merchant_r = latent_risk(seed, cards, merchants)
    rng = np.random.default_rng([seed, day.toordinal(), 14])
    card = rng.integers(0, cards, rows)
    merchant = rng.integers(0, merchants, rows)
    amount = np.round(rng.lognormal(3.4 + 1.2 * card_r[card], 1.0), 2)
    channel = rng.choice(CHANNELS, rows, p=[0.45, 0.4, 0.1, 0.05])
    logit = (
        -7.2
        + 6.0 * card_r[card]
        + 5.0 * merchant_r[merchant]
        + 0.3 * np.log1p(amount)
        + 0.9 * (channel == "moto")
        + 0.5 * (channel == "online")
    )
    is_fraud = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    times = with_event_time(pa.table({"card_id": card.astype(np.int64)}), day)["event_time"]
    return pa.table(
        {
            "transaction_id": [f"{day:%Y%m%d}-{seed}-{i:08d}" for i in range(rows)],
            "card_id": card.astype(np.int64),
            "merchant_id": merchant.astype(np.int64),
            "event_time": times,
            "amount": amount,
            "channel": channel,
            "is_fraud": is_fraud,
        }
    )


KEY_COLUMNS = ("card_id", "merchant_id", "event_time")


def refuse_problems(problems: list[Problem] | tuple[Problem, ...]) -> None:
    """The entity rows' columns are fixed (the feature views join on them) and their keys and
    time must stay whole: row problems on the other columns only."""
    refuse_column_problems(problems)
    for problem in problems:
        if problem.kind not in ("volume", "late_labels") and set(problem.args[0].split(",")) & set(
            KEY_COLUMNS
        ):
            raise ValueError(
                f"problem {problem}: {', '.join(KEY_COLUMNS)} are the keys and time the features join on; "
                "inject problems into amount, channel or is_fraud"
            )


FEATURE_STORE_YAML = """\
project: {project}
provider: local
registry: {repo}/registry.db
online_store:
  type: sqlite
  path: {repo}/online.db
offline_store:
  type: duckdb
entity_key_serialization_version: 3
"""

FEATURES_PY = '''\
"""Written by `trainpipe make-data --feast`: the card and merchant features of the fraud example."""

from datetime import timedelta

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.types import Float64, Int64

card = Entity(name="card", join_keys=["card_id"], value_type=ValueType.INT64)
merchant = Entity(name="merchant", join_keys=["merchant_id"], value_type=ValueType.INT64)

card_activity = FeatureView(
    name="card_activity",
    entities=[card],
    ttl=timedelta(days=2),
    schema=[
        Field(name="txn_count_7d", dtype=Int64),
        Field(name="amount_mean_7d", dtype=Float64),
        Field(name="amount_max_7d", dtype=Float64),
        Field(name="night_share_30d", dtype=Float64),
        Field(name="declines_7d", dtype=Int64),
    ],
    source=FileSource(
        name="card_activity_source",
        path={card_path!r},
        timestamp_field="event_timestamp",
        created_timestamp_column="created",
    ),
)

merchant_risk = FeatureView(
    name="merchant_risk",
    entities=[merchant],
    ttl=timedelta(days=30),
    schema=[
        Field(name="chargeback_rate_30d", dtype=Float64),
        Field(name="merchant_risk_score", dtype=Float64),
    ],
    source=FileSource(
        name="merchant_risk_source",
        path={merchant_path!r},
        timestamp_field="event_timestamp",
        created_timestamp_column="created",
    ),
)

{service} = FeatureService(name={service!r}, features=[card_activity, merchant_risk])
'''


def write_repo(repo: Path, card_path: Path, merchant_path: Path) -> None:
    """`feature_store.yaml` and `features.py` of the example's Feast repo, with absolute paths (the
    DuckDB offline store reads a relative source path from the working directory, not the repo)."""
    repo = repo.resolve()
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "feature_store.yaml").write_text(FEATURE_STORE_YAML.format(project=PROJECT, repo=repo))
    (repo / "features.py").write_text(
        FEATURES_PY.format(
            card_path=str(card_path.resolve()),
            merchant_path=str(merchant_path.resolve()),
            service=FEATURE_SERVICE,
        )
    )


def feast_apply(repo: Path, python: str | None = None) -> None:
    """`feast apply` in `repo` with the Feast interpreter: its registry and online tables."""
    from airflow_trainpipe.data.feature_store.client import apply

    apply(python=python, repo=repo)


def write_transactions(root: Path, day: date, rows: int, seed: int, problems: list[Problem]) -> Path:
    """One day's entity rows as `root/ds=YYYY-MM-DD/part-00000.parquet` (and `_SUCCESS`)."""
    table = transactions(day, rows, seed)
    rng = np.random.default_rng([seed, day.toordinal(), 1])
    for problem in problems:
        table = inject(table, problem, rng)
    partition = root / f"ds={day:%Y-%m-%d}"
    partition.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, partition / "part-00000.parquet", row_group_size=65536)
    (partition / "_SUCCESS").write_bytes(b"")
    return partition / "part-00000.parquet"


def write_feast_example(
    root: Path,
    start: date,
    days: int,
    rows: int,
    seed: int = 0,
    problems: dict[date, list[Problem]] | None = None,
    *,
    apply: bool = True,
    python: str | None = None,
) -> FeastExample:
    """The entity rows, the feature tables and the Feast repo under `root` (see the module),
    applied with the Feast interpreter `python` (default: `feast_python()`) unless not `apply`."""
    problems = problems or {}
    for injected in problems.values():
        refuse_problems(injected)
    root = root.resolve()
    last = start + timedelta(days=days - 1)
    files = tuple(
        write_transactions(root / "transactions", day, rows, seed, problems.get(day, []))
        for day in (start + timedelta(days=i) for i in range(days))
    )
    features = root / "features"
    features.mkdir(parents=True, exist_ok=True)
    card_path, merchant_path = features / "card_activity.parquet", features / "merchant_risk.parquet"
    pq.write_table(card_activity(seed, start, last, rows), card_path)
    pq.write_table(merchant_risk(seed, start, last, rows), merchant_path)
    write_repo(root / "repo", card_path, merchant_path)
    if apply:
        feast_apply(root / "repo", python)
    return FeastExample(root, root / "transactions", files, card_path, merchant_path, root / "repo")
