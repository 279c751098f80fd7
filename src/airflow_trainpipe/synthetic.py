"""Synthetic card transactions with a learnable fraud label, for the demo, tests and benchmarks.

One day is one partition `ds=YYYY-MM-DD/part-NNNNN.parquet` plus a `_SUCCESS` marker, fully
determined by (seed, day, problems): the same call always writes the same bytes.

Problems are what breaks real upstream exports, injected into a chosen day so the validation
checks can be shown to catch each one: `drop:COL`, `rename:COL:NEW`, `dtype:COL` (becomes
strings), `nulls:COL[:FRACTION]`, `out_of_range:COL[:VALUE]`, `volume:FRACTION` (keep that share
of rows) and `drift:COL[,COL...]` (shifted numeric / reweighted categorical distributions).
`late_labels:COL:VALUE` is the one no data check can see: frauds where COL == VALUE are labelled 0
because their chargebacks arrive after the export, so a model trained on that day learns the
segment is safe; only comparing it with a model trained on complete labels shows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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
        -5.2
        + 4.0 * merchant_risk
        + 0.45 * np.log1p(amount)
        + 1.1 * night
        + 0.025 * distance
        - 0.0004 * account_age
        + 0.25 * txn_24h
        + 0.9 * (channel == "moto")
        + 0.6 * (channel == "online")
        + 0.5 * np.isin(country, ["US", "GB"])
    )
    is_fraud = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    ids = [f"{day:%Y%m%d}-{seed}-{i:08d}" for i in range(rows)]
    return pa.table(
        {
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
        }
    )


# Each problem kind with its (fewest, most) colon-separated arguments.
_ARITY = {
    "drop": (1, 1),
    "rename": (2, 2),
    "dtype": (1, 1),
    "nulls": (1, 2),
    "out_of_range": (1, 2),
    "volume": (1, 1),
    "drift": (1, 1),
    "late_labels": (2, 2),
}
PROBLEM_KINDS = tuple(_ARITY)


@dataclass(frozen=True)
class Problem:
    """One injected data problem: `kind` and its colon-separated arguments."""

    kind: str
    args: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Problem:
        kind, *args = text.split(":")
        if kind not in _ARITY:
            raise ValueError(f"unknown problem {kind!r} in {text!r}; known: {', '.join(PROBLEM_KINDS)}")
        low, high = _ARITY[kind]
        if not low <= len(args) <= high or not all(args):
            raise ValueError(
                f"problem {text!r}: {kind} takes {low}{'' if low == high else f'-{high}'} argument(s)"
            )
        return cls(kind, tuple(args))

    def __str__(self) -> str:
        return ":".join((self.kind, *self.args))


def _column(table: pa.Table, name: str, problem: Problem) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise ValueError(f"problem {problem}: no column {name!r}; columns: {', '.join(table.column_names)}")
    return table[name]


def _replace(table: pa.Table, name: str, values: pa.Array | np.ndarray) -> pa.Table:
    return table.set_column(
        table.column_names.index(name), name, pa.array(values) if isinstance(values, np.ndarray) else values
    )


def inject(table: pa.Table, problem: Problem, rng: np.random.Generator) -> pa.Table:
    """Apply one problem to a clean day."""
    kind, args = problem.kind, problem.args
    if kind == "volume":
        keep = float(args[0])
        return table.slice(0, round(table.num_rows * keep))
    name = args[0]
    if kind == "drift":
        for column in name.split(","):
            values = _column(table, column, problem).to_numpy()
            if values.dtype.kind in "iuf":
                # A shift of one standard deviation plus a 50% stretch: far beyond the PSI 0.2 line.
                shifted = values * 1.5 + values.std()
                values = (
                    np.round(shifted).astype(values.dtype)
                    if values.dtype.kind in "iu"
                    else np.round(shifted, 4)
                )
            else:
                # Reverse the category frequencies: the rare become common.
                categories, counts = np.unique(values, return_counts=True)
                order = np.argsort(counts)
                weights = counts[order][::-1] / counts.sum()
                values = rng.choice(categories[order], len(values), p=weights)
            table = _replace(table, column, values)
        return table
    column = _column(table, name, problem)
    if kind == "late_labels":
        segment = pc.equal(column.cast(pa.string()), args[1])
        return _replace(
            table,
            "is_fraud",
            pc.if_else(segment, pa.scalar(0, pa.int64()), table["is_fraud"]).combine_chunks(),
        )
    if kind == "drop":
        return table.drop_columns([name])
    if kind == "rename":
        return table.rename_columns([args[1] if c == name else c for c in table.column_names])
    if kind == "dtype":
        return _replace(table, name, column.cast(pa.string()))
    mask = rng.random(table.num_rows) < (float(args[1]) if kind == "nulls" and len(args) > 1 else 0.05)
    if kind == "nulls":
        return _replace(table, name, pa.array(column.to_numpy(zero_copy_only=False), mask=mask))
    # out_of_range: a sentinel no valid row has (upstream "unknown" codes are the usual culprit).
    sentinel = float(args[1]) if len(args) > 1 else -999.0
    values = column.to_numpy().copy()
    values[mask] = sentinel
    return _replace(table, name, values)


def write_day(
    root_uri: str,
    day: date,
    rows: int,
    seed: int = 0,
    files: int = 1,
    problems: list[Problem] | tuple[Problem, ...] = (),
) -> list[str]:
    """Write one day's partition; returns the file URIs in order."""
    table = transactions(day, rows, seed)
    rng = np.random.default_rng([seed, day.toordinal(), 1])
    for problem in problems:
        table = inject(table, problem, rng)
    rows = table.num_rows
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
