"""Synthetic card transactions with a learnable fraud label, for the demo, tests and benchmarks.

One day is one partition `ds=YYYY-MM-DD/part-NNNNN.parquet` plus a `_SUCCESS` marker, fully
determined by (seed, day): the same call always writes the same bytes.
"""

from __future__ import annotations

from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_trainpipe.storage import filesystem, join

CHANNELS = ["online", "pos", "atm", "moto"]
COUNTRIES = ["NL", "DE", "FR", "GB", "US", "ES", "IT", "PL"]


def transactions(day: date, rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng([seed, day.toordinal()])
    amount = np.round(rng.lognormal(3.5, 1.1, rows), 2)
    hour = rng.integers(0, 24, rows)
    merchant_risk = np.round(rng.beta(2, 8, rows), 4)
    distance = np.round(rng.exponential(12.0, rows), 2)
    account_age = rng.integers(1, 3650, rows)
    txn_24h = rng.poisson(2.0, rows)
    channel = rng.choice(CHANNELS, rows, p=[0.45, 0.4, 0.1, 0.05])
    country = rng.choice(COUNTRIES, rows, p=[0.4, 0.15, 0.12, 0.1, 0.08, 0.07, 0.05, 0.03])
    night = (hour < 6).astype(float)
    logit = (
        -5.2 + 4.0 * merchant_risk + 0.45 * np.log1p(amount) + 1.1 * night + 0.025 * distance
        - 0.0004 * account_age + 0.25 * txn_24h + 0.9 * (channel == "moto") + 0.6 * (channel == "online")
        + 0.5 * np.isin(country, ["US", "GB"])
    )
    is_fraud = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    ids = [f"{day:%Y%m%d}-{seed}-{i:08d}" for i in range(rows)]
    return pa.table({
        "transaction_id": ids,
        "amount": amount,
        "hour": hour.astype(np.int64),
        "merchant_risk": merchant_risk,
        "distance_from_home_km": distance,
        "account_age_days": account_age.astype(np.int64),
        "txn_count_24h": txn_24h.astype(np.int64),
        "channel": channel,
        "country": country,
        "is_fraud": is_fraud,
    })


def write_day(root_uri: str, day: date, rows: int, seed: int = 0, files: int = 1) -> list[str]:
    """Write one day's partition; returns the file URIs in order."""
    table = transactions(day, rows, seed)
    partition = join(root_uri, f"ds={day:%Y-%m-%d}")
    fs, base = filesystem(partition)
    fs.makedirs(base, exist_ok=True)
    uris = []
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for i in range(files):
        uri = join(partition, f"part-{i:05d}.parquet")
        with fs.open(filesystem(uri)[1], "wb") as handle:
            pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]), handle, row_group_size=65536)
        uris.append(uri)
    fs.pipe_file(f"{base}/_SUCCESS", b"")
    return uris
