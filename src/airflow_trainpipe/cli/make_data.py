"""`trainpipe make-data`: the examples' synthetic days, as files, an SQLite table, a Delta or
Iceberg table, or a Feast repo (`examples/`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_trainpipe.cli.common import at_least

if TYPE_CHECKING:
    from airflow_trainpipe.examples.synthetic import Problem


def _make_data(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from airflow_trainpipe.examples.synthetic import Problem

    try:
        start = date.fromisoformat(args.start)
        problems: dict[date, list[Problem]] = {}
        for text in args.problem:
            day, sep, spec = text.partition("=")
            if not sep:
                raise ValueError(
                    f"--problem {text!r}: expected DAY=KIND[:ARGS], e.g. 2026-01-03=drift:amount"
                )
            problems.setdefault(date.fromisoformat(day), []).append(Problem.parse(spec))
        days = [start + timedelta(days=i) for i in range(args.days)]
        if stray := sorted(set(problems) - set(days)):
            raise ValueError(
                f"--problem for {stray[0]}, which is not among the {args.days} day(s) from {start}"
            )
        if args.sqlite:
            _make_data_sqlite(args, days, problems)
        elif args.iceberg:
            _make_data_iceberg(args, days, problems)
        elif args.delta:
            _make_data_delta(args, days, problems)
        elif args.feast:
            _make_data_feast(args, days, problems)
        else:
            _make_data_files(args, days, problems)
    except ValueError as exc:
        print(f"trainpipe make-data: {exc}", file=sys.stderr)
        return 2
    return 0


def _make_data_files(args: argparse.Namespace, days: list[date], problems: dict[date, list[Problem]]) -> None:
    from airflow_trainpipe.examples.synthetic import write_day

    root = args.out if "://" in args.out else Path(args.out).resolve().as_uri()
    for day in days:
        files = write_day(
            root,
            day,
            args.rows,
            seed=args.seed,
            files=args.files,
            problems=problems.get(day, ()),
            kind=args.kind,
        )
        injected = ", ".join(map(str, problems.get(day, ()))) or "clean"
        print(f"{files[0].rsplit('/', 2)[0]}/ds={day}: {len(files)} file(s), {injected}")


def _write_table_days(
    args: argparse.Namespace,
    days: list[date],
    problems: dict[date, list[Problem]],
    write: Callable[[date, list[Problem]], str],
    one_day: str,
) -> None:
    """Each day written into a table by `write`, which says what it wrote."""
    if args.files != 1:
        raise ValueError(f"--files splits Parquet days (--out); {one_day}")
    for day in days:
        wrote = write(day, problems.get(day, []))
        print(f"{wrote}, {', '.join(map(str, problems.get(day, ()))) or 'clean'}")


def _make_data_sqlite(
    args: argparse.Namespace, days: list[date], problems: dict[date, list[Problem]]
) -> None:
    """The days as rows of one table of an SQLite database, and the Airflow connection to it."""
    import shlex

    from airflow_trainpipe.examples.synthetic import (
        DAY_COLUMN,
        WAREHOUSE_CONN_ID,
        sqlite_connection_uri,
        write_day_sqlite,
    )

    path = Path(args.sqlite).resolve()

    def write(day: date, injected: list[Problem]) -> str:
        rows = write_day_sqlite(path, day, args.rows, seed=args.seed, problems=injected, kind=args.kind)
        return f"{path} table {args.kind} {DAY_COLUMN}={day}: {rows} row(s)"

    _write_table_days(args, days, problems, write, "an SQLite database is one file")
    print(
        f"Airflow connection to it (dags/configs/fraud_detector_sql.yaml reads {WAREHOUSE_CONN_ID}):\n"
        f"export AIRFLOW_CONN_{WAREHOUSE_CONN_ID.upper()}={shlex.quote(sqlite_connection_uri(path))}"
    )


def _make_data_iceberg(
    args: argparse.Namespace, days: list[date], problems: dict[date, list[Problem]]
) -> None:
    """The days as a table of an Iceberg SQL catalog on SQLite, and the Airflow connection to it."""
    import shlex

    from airflow_trainpipe.examples.iceberg_table import (
        LAKE_CONN_ID,
        TIME_COLUMN,
        connection,
        write_day_iceberg,
    )

    folder = Path(args.iceberg).resolve()

    def write(day: date, injected: list[Problem]) -> str:
        table, rows = write_day_iceberg(
            folder, day, args.rows, seed=args.seed, problems=injected, kind=args.kind
        )
        return f"{folder} table {table} day({TIME_COLUMN})={day}: {rows} row(s)"

    _write_table_days(args, days, problems, write, "an Iceberg day is one data file")
    print(
        f"Airflow connection to its catalog (dags/configs/fraud_detector_iceberg.yaml reads {LAKE_CONN_ID}):\n"
        f"export AIRFLOW_CONN_{LAKE_CONN_ID.upper()}={shlex.quote(connection(folder))}"
    )


def _make_data_delta(args: argparse.Namespace, days: list[date], problems: dict[date, list[Problem]]) -> None:
    """The days as partitions of a Delta table (dags/configs/fraud_detector_delta.yaml's)."""
    from airflow_trainpipe.examples.delta_table import PARTITION_COLUMN, write_day_delta

    folder = Path(args.delta).resolve()

    def write(day: date, injected: list[Problem]) -> str:
        rows = write_day_delta(folder, day, args.rows, seed=args.seed, problems=injected, kind=args.kind)
        return f"{folder} {PARTITION_COLUMN}={day}: {rows} row(s)"

    _write_table_days(args, days, problems, write, "a Delta day is one commit")


def _make_data_feast(args: argparse.Namespace, days: list[date], problems: dict[date, list[Problem]]) -> None:
    """Labelled transactions (the entity rows), card and merchant features and a Feast repo over
    them, applied with the Feast interpreter (the feature-store example)."""
    from airflow_trainpipe.data.feature_store.client import FeatureStoreError
    from airflow_trainpipe.examples.feast_repo import write_feast_example

    if args.files != 1:
        raise ValueError("--files splits Parquet days (--out); a --feast day is one file")
    if args.kind != "card_transactions":
        raise ValueError(f"--feast writes card transactions and their features, not --kind {args.kind}")
    if not days:
        raise ValueError("--feast needs --days 1 or more")
    try:
        example = write_feast_example(Path(args.feast), days[0], len(days), args.rows, args.seed, problems)
    except FeatureStoreError as exc:
        raise ValueError(str(exc)) from exc
    import pyarrow.parquet as pq

    for day, file in zip(days, example.transaction_files, strict=True):
        rows = pq.ParquetFile(file).metadata.num_rows
        print(f"{file.parent}: {rows} row(s), {', '.join(map(str, problems.get(day, ()))) or 'clean'}")
    print(f"features: {example.card_activity}, {example.merchant_risk}")
    print(f"Feast repo (applied): {example.repo}")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    make_data = commands.add_parser(
        "make-data",
        help="write synthetic daily partitions (card transactions, house sales, support tickets or search results), "
        "or the days' rows into an SQLite table or an Iceberg table, optionally with injected problems",
    )
    make_data.add_argument(
        "--kind",
        choices=("card_transactions", "house_sales", "support_tickets", "search_results"),
        default="card_transactions",
        help="card_transactions (binary is_fraud), house_sales (regression sale_price), support_tickets "
        "(multiclass team), search_results (ranking: relevance within query_id); default card_transactions",
    )
    target = make_data.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--out", help="dataset root of Parquet days ds=YYYY-MM-DD/: a folder or a URI (s3://bucket/prefix)"
    )
    target.add_argument(
        "--sqlite",
        metavar="PATH",
        help="instead, rows of table KIND (plus event_date 'YYYY-MM-DD') in this SQLite database, "
        "a day's old rows replaced; prints the Airflow connection to define (the sql source example)",
    )
    target.add_argument(
        "--iceberg",
        metavar="DIR",
        help="instead, rows of Iceberg table trainpipe.KIND (plus event_time, partitioned by its day) "
        "in a SQL catalog on DIR/catalog.db (SQLite) with its warehouse in DIR/warehouse, a day's old "
        "rows replaced; prints the Airflow connection to define (the iceberg source example)",
    )
    target.add_argument(
        "--delta",
        metavar="DIR",
        help="instead, rows of KIND (plus event_time, and ds, the partition column) in a Delta table "
        "at DIR, a day's partition replaced (the delta source example: its table, needs no connection)",
    )
    target.add_argument(
        "--feast",
        metavar="DIR",
        help="instead, card transactions (keys, no features) in DIR/transactions/ds=YYYY-MM-DD/, their card and "
        "merchant features in DIR/features/, a Feast repo over them in DIR/repo applied with $TRAINPIPE_FEAST_PYTHON",
    )
    make_data.add_argument("--start", default="2026-01-01", help="first day (default 2026-01-01)")
    make_data.add_argument("--days", type=at_least(1), default=1, help="daily partitions (default 1)")
    make_data.add_argument(
        "--rows", type=at_least(1), default=20_000, help="rows per day before problems (default 20000)"
    )
    make_data.add_argument("--files", type=at_least(1), default=1, help="files per day (default 1; --out)")
    make_data.add_argument("--seed", type=int, default=0, help="the same seed always writes the same bytes")
    make_data.add_argument(
        "--problem",
        action="append",
        default=[],
        metavar="DAY=KIND[:ARGS]",
        help="inject a problem into one day (repeatable): drop:COL, rename:COL:NEW, dtype:COL, nulls:COL[:FRACTION], "
        "out_of_range:COL[:VALUE], volume:FRACTION, drift:COL[,COL...] (--sqlite, --iceberg, --delta, --feast: not the first three; --feast: not on "
        "card_id, merchant_id, event_time)",
    )
    make_data.set_defaults(handler=_make_data)
