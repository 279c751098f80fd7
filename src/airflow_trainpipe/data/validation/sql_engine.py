"""`validation.engine: sql`: the Great Expectations suite run in the source's database.

GX's SQL execution engine runs each expectation as queries over a query asset, the run's
rendered window query, so the database does the counting and no rows reach the worker. The
rows were exported into the snapshot store just before (training reads those files); a COUNT
of the same query, compared with the export's row count, catches a window whose rows changed
in between, which would make the verdict be about other rows than the ones trained on.

GX 1.24 quirks coded around: a query asset's column names are read by running the bare query
(metrics/util.py `column_reflection_fallback`, no LIMIT), which with psycopg's client-side cursor
fetched every row of the window into the worker (+227 MB at 1M rows): that one statement is
rewritten to a `LIMIT 0` of itself; numpy scalars in expectation kwargs are rendered into the SQL
literally, and `ValidationDefinition.run` cannot serialise the quantile expectation's result
(engines.WholeSuiteRunner handles both).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow_trainpipe.config.pipeline import PipelineConfig
from airflow_trainpipe.config.validation import ExpectationRule
from airflow_trainpipe.contracts.manifest import Manifest
from airflow_trainpipe.contracts.payloads import Check
from airflow_trainpipe.data.validation.engines import WholeSuiteRunner, rows_check, suite_checks
from airflow_trainpipe.data.validation.expectations import ExpectationOutcome

if TYPE_CHECKING:
    from airflow_trainpipe.data.validation.report import ValidationReport


def sqlalchemy_url(conn_id: str) -> str:
    """SQLAlchemy URL of an Airflow connection: PostgreSQL through psycopg 3, SQLite by path."""
    from airflow_trainpipe.data.sources.errors import SourceError
    from airflow_trainpipe.data.sources.sql import (
        POSTGRES_TYPES,
        SQLITE_TYPES,
        airflow_connection,
        postgres_uri,
        sqlite_path,
    )

    conn = airflow_connection(conn_id)
    kind = (conn.conn_type or "").lower()
    if kind in POSTGRES_TYPES:
        return "postgresql+psycopg://" + postgres_uri(conn).removeprefix("postgresql://")
    if kind in SQLITE_TYPES:
        return f"sqlite:///{quote(str(sqlite_path(conn)))}"
    raise SourceError(
        f"validation.engine 'sql' runs on PostgreSQL and SQLite connections; {conn_id!r} is a {kind!r} connection"
    )


@contextmanager
def _columns_without_rows(query: str) -> Iterator[None]:
    """While GX runs: its column-name probe of the query asset (the bare query text, which no
    metric executes otherwise: they wrap it in a subquery) runs as `LIMIT 0`, the same columns
    without the rows. GX builds its own engine from the URL, so the hook is on every engine, for
    this exact text only, and removed afterwards."""
    import sqlalchemy as sa

    def probe(conn: Any, clause: Any, multiparams: Any, params: Any, options: Any) -> Any:
        if isinstance(clause, sa.TextClause) and clause.text == query:
            clause = sa.text(f"SELECT * FROM ({query}) AS trainpipe_probe LIMIT 0")
        return clause, multiparams, params

    sa.event.listen(sa.engine.Engine, "before_execute", probe, retval=True)
    try:
        yield
    finally:
        sa.event.remove(sa.engine.Engine, "before_execute", probe)


class SqlExpectationRunner(WholeSuiteRunner):
    """The suite on one query asset of a SQL data source, run once, in the database."""

    def __init__(self, rules: list[ExpectationRule], url: str, query: str) -> None:
        from airflow_trainpipe.data.sources.sql import statement

        self.url = url
        self.query = statement(query)
        super().__init__(rules)

    def _batch_definition(self) -> Any:
        sources = self.context.data_sources
        if self.url.startswith("sqlite"):
            self.database: Any = sources.add_sqlite(self.name, connection_string=self.url)
        else:
            self.database = sources.add_postgres(self.name, connection_string=self.url)
        return self.database.add_query_asset("window", query=self.query).add_batch_definition_whole_table(
            "batch"
        )

    def _validate(self, frame: Any, part: str) -> Any:
        return self._asset.get_batch().validate(self._suites[part], result_format="BASIC")

    def run(self) -> list[ExpectationOutcome]:
        with _columns_without_rows(self.query):
            return super().run()

    def row_count(self) -> int:
        """COUNT(*) of the window query, in the database."""
        import sqlalchemy as sa

        from airflow_trainpipe.data.sources.sql import counted

        with self.database.get_engine().connect() as connection:
            return int(connection.execute(sa.text(counted(self.query))).scalar_one())


def checks_in_database(
    config: PipelineConfig,
    manifest: Manifest,
    rules: list[ExpectationRule],
    query: str,
    report: ValidationReport,
    accumulators: dict[str, Any],
) -> list[Check]:
    """The suite on the window query through GX's SQL engine, the drift profiles counted there
    too, and a COUNT of the query against the export's rows (the verdict must be about the rows
    that were frozen)."""
    source = config.data.source
    assert source.kind == "sql"
    runner = SqlExpectationRunner(rules, sqlalchemy_url(source.conn_id), query)
    checks = [
        rows_check(
            "source_unchanged",
            runner.row_count(),
            manifest.rows,
            "the window query, run in the database, returns",
            "the source changed during validation; run again",
        )
    ]
    fill_profiles(runner, source.order_by, accumulators)
    if rules:
        checks += suite_checks(runner, report)
    return checks


def fill_profiles(runner: SqlExpectationRunner, order_by: list[str], accumulators: dict[str, Any]) -> None:
    """The drift profiles, counted in the database; the same numbers as the streamed pass over the
    exported files (which are in `order_by` order): one scan for every feature's null count and its
    counts at the reference's edges (exact), a GROUP BY per categorical feature, and per numeric
    feature the strided sample its percentiles are taken from (at most drift.SAMPLE_ROWS values,
    whatever the window's size: the rows themselves never reach the worker)."""
    from airflow_trainpipe.data.validation.drift import NumericAccumulator

    if not accumulators:
        return
    engine = runner.database.get_engine()
    quote = engine.dialect.identifier_preparer.quote
    with engine.connect() as connection:
        _fill_counts(connection, runner.query, accumulators, quote)
        keys = [quote(k) for k in order_by]
        numeric = {n: a for n, a in accumulators.items() if isinstance(a, NumericAccumulator)}
        # Columns without nulls share their positions among the non-null values: one query for all.
        whole = {n: a for n, a in numeric.items() if a.nulls == 0}
        if whole:
            _fill_samples(connection, runner.query, whole, keys, quote)
        for name, accumulator in numeric.items():
            if name not in whole:
                _fill_samples(connection, runner.query, {name: accumulator}, keys, quote)
        for name, accumulator in accumulators.items():
            if name not in numeric:
                _fill_categories(connection, runner.query, name, accumulator, quote)


def _fill_counts(connection: Any, query: str, accumulators: dict[str, Any], quote: Any) -> None:
    """One scan: each feature's non-null count, and each numeric one's counts at its edges."""
    import numpy as np
    import sqlalchemy as sa

    from airflow_trainpipe.data.validation.drift import NumericAccumulator

    columns, params = ["COUNT(*)"], {}
    for i, (name, accumulator) in enumerate(accumulators.items()):
        columns.append(f"COUNT({quote(name)})")
        if isinstance(accumulator, NumericAccumulator) and accumulator.edges is not None:
            for j, edge in enumerate(accumulator.edges):
                params[f"e{i}_{j}"] = float(edge)  # bound, never rendered: GX 1.24 prints numpy floats raw
                columns.append(f"SUM(CASE WHEN {quote(name)} <= :e{i}_{j} THEN 1 ELSE 0 END)")
    row = iter(connection.execute(sa.text(f"SELECT {', '.join(columns)} FROM ({query}) AS q"), params).one())
    total = int(next(row))
    for accumulator in accumulators.values():
        accumulator.nulls = total - int(next(row))
        if isinstance(accumulator, NumericAccumulator):
            accumulator.count = total - accumulator.nulls
            if accumulator.edges is not None:
                accumulator.at_or_below = np.array(
                    [int(next(row) or 0) for _ in accumulator.edges], dtype=np.int64
                )


def _fill_samples(
    connection: Any, query: str, accumulators: dict[str, Any], keys: list[str], quote: Any
) -> None:
    """The numeric features' strided samples: every `stride`-th non-null value in export order
    (several features at once only when none of them has nulls, so their positions agree)."""
    import numpy as np
    import sqlalchemy as sa

    columns = [quote(name) for name in accumulators]
    not_null = " AND ".join(f"{c} IS NOT NULL" for c in columns)
    sampled = (
        f"SELECT {', '.join(columns)} FROM (SELECT {', '.join(columns)}, ROW_NUMBER() OVER "
        f"(ORDER BY {', '.join(keys)}) AS trainpipe_rn FROM ({query}) AS q WHERE {not_null}) AS s "
        "WHERE (s.trainpipe_rn - 1) % :stride = 0"
    )
    stride = next(iter(accumulators.values())).stride
    rows = connection.execute(sa.text(sampled), {"stride": stride}).all()
    for index, accumulator in enumerate(accumulators.values()):
        accumulator.samples = [np.asarray([row[index] for row in rows], dtype=np.float64)]


def _fill_categories(connection: Any, query: str, name: str, accumulator: Any, quote: Any) -> None:
    """The categorical feature's value counts (keys as the streamed profile writes them: str())."""
    import sqlalchemy as sa

    column = quote(name)
    grouped = f"SELECT {column}, COUNT(*) FROM ({query}) AS q WHERE {column} IS NOT NULL GROUP BY {column}"
    for value, count in connection.execute(sa.text(grouped)):
        key = str(value)
        accumulator.counts[key] = accumulator.counts.get(key, 0) + int(count)
