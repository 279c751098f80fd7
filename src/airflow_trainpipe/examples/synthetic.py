"""Synthetic daily data with a learnable label, for the demo, tests and benchmarks, one kind per
task: card transactions (binary `is_fraud`), house sales (regression `sale_price`), support
tickets (multiclass `team`) and search results (ranking: graded `relevance` of each result within
its `query_id`, a query's rows adjacent).

One day is one partition `ds=YYYY-MM-DD/part-NNNNN.parquet` plus a `_SUCCESS` marker, fully
determined by (seed, day, problems): the same call always writes the same bytes. Or the same rows
go into an SQLite table named after the kind, with the day in `event_date` (`write_day_sqlite`,
`trainpipe make-data --sqlite`): the warehouse of the `sql` source example.

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
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_trainpipe.core.storage import filesystem, join

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
        fraud = _column(table, "is_fraud", problem)  # card transactions only
        return _replace(
            table, "is_fraud", pc.if_else(segment, pa.scalar(0, pa.int64()), fraud).combine_chunks()
        )
    if kind == "drop":
        return table.drop_columns([name])
    if kind == "rename":
        return table.rename_columns([args[1] if c == name else c for c in table.column_names])
    if kind == "dtype":
        # The upstream type change a schema check must catch: numbers arrive as strings, and a
        # column of strings (a text or category column) as numbers, here each string's length.
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            return _replace(table, name, pc.utf8_length(column).cast(pa.int64()))
        return _replace(table, name, column.cast(pa.string()))
    mask = rng.random(table.num_rows) < (float(args[1]) if kind == "nulls" and len(args) > 1 else 0.05)
    if kind == "nulls":
        return _replace(table, name, pa.array(column.to_numpy(zero_copy_only=False), mask=mask))
    # out_of_range: a sentinel no valid row has (upstream "unknown" codes are the usual culprit).
    sentinel = float(args[1]) if len(args) > 1 else -999.0
    values = column.to_numpy().copy()
    values[mask] = sentinel
    return _replace(table, name, values)


TEAMS = ["account", "billing", "shipping", "technical"]
PRODUCTS = ["app", "card", "loan", "savings", "web"]
TIERS = ["free", "plus", "business"]


def support_tickets(day: date, rows: int, seed: int) -> pa.Table:
    """Tickets routed to one of four teams. Who sent a ticket and about which product says a little
    about the team; what the ticket says (its `subject` and `body`, examples.tickets) says most:
    a model that reads the text routes clearly better than one that reads the columns alone."""
    from airflow_trainpipe.examples.tickets import ticket_texts

    rng = np.random.default_rng([seed, day.toordinal(), 2])
    attachments = rng.poisson(0.6, rows)
    prior = rng.poisson(1.5, rows)
    hour = rng.integers(0, 24, rows)
    amount_mentioned = np.round(np.where(rng.random(rows) < 0.4, rng.lognormal(4.0, 1.0, rows), 0.0), 2)
    product = rng.choice(PRODUCTS, rows, p=[0.3, 0.25, 0.15, 0.1, 0.2])
    tier = rng.choice(TIERS, rows, p=[0.6, 0.3, 0.1])
    logits = np.stack(
        [
            0.4 * prior + 0.8 * (tier == "business") - 0.2 * attachments,  # account
            0.02 * amount_mentioned**0.5 * 3 + 1.2 * np.isin(product, ["card", "loan"]),  # billing
            1.5 * (attachments > 0) + 0.6 * (product == "card") - 0.3 * (hour < 8),  # shipping
            1.4 * np.isin(product, ["app", "web"]) - 0.3,  # technical
        ],
        axis=1,
    )
    logits *= 0.8  # the columns hint at the team; the text tells it
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    team = np.array(TEAMS)[np.minimum((rng.random((rows, 1)) > probabilities.cumsum(axis=1)).sum(axis=1), 3)]
    subjects, bodies = ticket_texts(team, rng)
    return pa.table(
        {
            "ticket_id": [f"{day:%Y%m%d}-{seed}-{i:08d}" for i in range(rows)],
            "message_length": np.array([len(b) for b in bodies], np.int64),
            "attachments": attachments.astype(np.int64),
            "prior_tickets": prior.astype(np.int64),
            "hour": hour.astype(np.int64),
            "amount_mentioned": amount_mentioned,
            "product": product,
            "customer_tier": tier,
            "subject": pa.array(subjects, pa.string()),
            "body": pa.array(bodies, pa.string()),
            "team": team,
        }
    )


DEVICES = ["desktop", "mobile", "tablet"]


def search_results(day: date, rows: int, seed: int) -> pa.Table:
    """About `rows` results of queries with 5-35 results each, a query's rows adjacent; relevance
    0-4 grows with text match, click history and category match, shrinks with price."""
    rng = np.random.default_rng([seed, day.toordinal(), 3])
    sizes = rng.integers(5, 36, max(1, rows // 20) + 1)
    sizes = sizes[: max(1, int(np.searchsorted(np.cumsum(sizes), rows)) + 1)]
    n = int(sizes.sum())
    query = np.repeat(np.arange(len(sizes)), sizes)
    bm25 = np.round(rng.gamma(2.0, 2.5, n), 4)
    click_rate = np.round(rng.beta(1.5, 12, n), 4)
    price = np.round(rng.lognormal(3.2, 0.9, n), 2)
    freshness = rng.integers(0, 365, n)
    category_match = rng.choice(["exact", "related", "none"], n, p=[0.3, 0.4, 0.3])
    device = rng.choice(DEVICES, len(sizes), p=[0.45, 0.45, 0.1])[query]
    latent = (
        0.35 * bm25
        + 9.0 * click_rate
        + 1.3 * (category_match == "exact")
        + 0.5 * (category_match == "related")
        - 0.25 * np.log1p(price)
        - 0.002 * freshness
        + rng.normal(0, 1.2, n)
        + rng.normal(0, 0.5, len(sizes))[query]  # some queries are easier than others
    )
    relevance = np.clip(np.floor(latent - 2.2), 0, 4).astype(np.int64)  # most results: 0
    return pa.table(
        {
            "query_id": np.array([f"{day:%Y%m%d}-{seed}-q{q:07d}" for q in range(len(sizes))])[query],
            "bm25": bm25,
            "click_rate": click_rate,
            "price": price,
            "freshness_days": freshness.astype(np.int64),
            "category_match": category_match,
            "device": device,
            "relevance": relevance,
        }
    )


BUILDING_TYPES = ["apartment", "terraced", "semi_detached", "detached"]


def house_sales(day: date, rows: int, seed: int) -> pa.Table:
    """Sales priced by size, age, distance to the centre, neighbourhood and building type."""
    rng = np.random.default_rng([seed, day.toordinal(), 4])
    area = np.round(rng.lognormal(4.5, 0.35, rows), 1)
    lot = np.round(rng.lognormal(5.3, 0.7, rows), 1)
    rooms = np.clip(np.round(area / 28 + rng.normal(0, 0.7, rows)), 1, 12)
    year = rng.integers(1900, 2026, rows)
    distance = np.round(rng.exponential(8.0, rows) + 0.3, 2)
    neighbourhood = np.array([f"n{i:02d}" for i in range(40)])[rng.integers(0, 40, rows)]
    premium = np.random.default_rng(seed).normal(0, 0.25, 40)  # the same neighbourhoods every day
    building = rng.choice(BUILDING_TYPES, rows, p=[0.45, 0.25, 0.15, 0.15])
    log_price = (
        np.log(3200 * area)
        + 0.08 * np.log(lot)
        - 0.012 * distance
        + 0.0015 * (year - 1960)
        + premium[[int(n[1:]) for n in neighbourhood]]
        + 0.15 * (building == "detached")
        + rng.normal(0, 0.12, rows)
    )
    return pa.table(
        {
            "sale_id": [f"{day:%Y%m%d}-{seed}-{i:08d}" for i in range(rows)],
            "living_area_m2": area,
            "lot_area_m2": lot,
            "rooms": rooms.astype(np.int64),
            "year_built": year.astype(np.int64),
            "distance_to_center_km": distance,
            "neighbourhood": neighbourhood,
            "building_type": building,
            "sale_price": np.round(np.exp(log_price), -2),
        }
    )


KINDS = {
    "card_transactions": transactions,
    "house_sales": house_sales,
    "support_tickets": support_tickets,
    "search_results": search_results,
}


def day_table(
    day: date,
    rows: int,
    seed: int = 0,
    problems: list[Problem] | tuple[Problem, ...] = (),
    kind: str = "card_transactions",
) -> pa.Table:
    """One day's rows of `kind` (see KINDS), the problems injected in order."""
    table = KINDS[kind](day, rows, seed)
    rng = np.random.default_rng([seed, day.toordinal(), 1])
    for problem in problems:
        table = inject(table, problem, rng)
    return table


def write_day(
    root_uri: str,
    day: date,
    rows: int,
    seed: int = 0,
    files: int = 1,
    problems: list[Problem] | tuple[Problem, ...] = (),
    kind: str = "card_transactions",
) -> list[str]:
    """Write one day's partition of `kind` (see KINDS); returns the file URIs in order."""
    table = day_table(day, rows, seed, problems, kind)
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


# A warehouse table for the `sql` source example: the day's rows with the day as ISO text, which
# SQLite compares as text: `event_date >= '2026-01-05'` is right for 'YYYY-MM-DD' strings (an ISO
# timestamp literal against '2026-01-05 10:00:00' text would not be).
DAY_COLUMN = "event_date"
WAREHOUSE_CONN_ID = "trainpipe_warehouse"
"""The connection dags/configs/fraud_detector_sql.yaml reads its rows through."""
# A table's columns are fixed when it is created: these problems change a day's columns, which
# an INSERT cannot do (SQLite would also convert `dtype`'s strings back to the column's numbers).
COLUMN_PROBLEMS = ("drop", "rename", "dtype")
_SQLITE_TYPES = {"int64": "INTEGER", "double": "REAL", "string": "TEXT"}


def sqlite_connection_uri(path: Path) -> str:
    """Airflow's URI of an SQLite connection (its `host` is the file's absolute path)."""
    return "sqlite://" + quote(str(path.resolve()), safe="")


def refuse_column_problems(problems: list[Problem] | tuple[Problem, ...]) -> None:
    """A table source's days: its columns are fixed, so only row problems can be injected."""
    if column_problems := [str(p) for p in problems if p.kind in COLUMN_PROBLEMS]:
        raise ValueError(
            f"problem {column_problems[0]}: a table's columns are fixed; "
            f"{', '.join(COLUMN_PROBLEMS)} apply to Parquet days (--out) only"
        )


def write_day_sqlite(
    path: Path,
    day: date,
    rows: int,
    seed: int = 0,
    problems: list[Problem] | tuple[Problem, ...] = (),
    kind: str = "card_transactions",
) -> int:
    """Replace one day's rows of table `kind` in the SQLite database `path` (created with its table
    when missing) with the rows `write_day` writes, plus `event_date` ('YYYY-MM-DD'); returns the
    rows written. Run again for the same day, it leaves that day's new rows only."""
    import sqlite3

    refuse_column_problems(problems)
    table = day_table(day, rows, seed, problems, kind)
    table = table.append_column(DAY_COLUMN, pa.array([day.isoformat()] * table.num_rows, pa.string()))
    columns = [f'"{field.name}" {_SQLITE_TYPES.get(str(field.type), "")}'.rstrip() for field in table.schema]
    names = ", ".join(f'"{name}"' for name in table.column_names)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    try:
        with db:  # one transaction: the day's old rows go only when its new ones are in
            db.execute(f'CREATE TABLE IF NOT EXISTS "{kind}" ({", ".join(columns)})')
            db.execute(f'CREATE INDEX IF NOT EXISTS "{kind}_{DAY_COLUMN}" ON "{kind}" ("{DAY_COLUMN}")')
            db.execute(f'DELETE FROM "{kind}" WHERE "{DAY_COLUMN}" = ?', (day.isoformat(),))
            db.executemany(
                f'INSERT INTO "{kind}" ({names}) VALUES ({", ".join("?" * table.num_columns)})',
                zip(*(column.to_pylist() for column in table.columns), strict=True),
            )
    except sqlite3.Error as exc:
        raise ValueError(f"{path}: table {kind}: {exc}") from exc
    finally:
        db.close()
    return table.num_rows


TIME_COLUMN = "event_time"
"""The instant of each row in the table source examples (delta, iceberg)."""


def with_event_time(table: pa.Table, day: date) -> pa.Table:
    """The rows with `event_time` (UTC, microseconds) spread evenly over `day`, in row order."""
    from datetime import UTC, datetime, timedelta

    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    rows = table.num_rows
    times = [start + timedelta(seconds=(86_400 * i) // max(rows, 1)) for i in range(rows)]
    return table.append_column(TIME_COLUMN, pa.array(times, pa.timestamp("us", tz="UTC")))
