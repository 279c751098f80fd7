"""`validation`: the checks a snapshot must pass before anything is trained on it."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from airflow_trainpipe.config.base import FieldProblems, Section, field_problems
from airflow_trainpipe.config.data import DataSection, FeatureColumns
from airflow_trainpipe.config.gx_catalog import ENGINES, EXPECTATIONS, ORDER_DEPENDENT
from airflow_trainpipe.config.suggest import did_you_mean
from airflow_trainpipe.config.types import ColumnName


class ExpectationRule(Section):
    """One Great Expectations 1.x expectation, by its snake_case type and its kwargs."""

    type: str
    """Expectation type, e.g. `expect_column_values_to_not_be_null`."""

    kwargs: dict[str, Any] = {}
    """Arguments of the expectation, e.g. `{column: amount, min_value: 0}`."""

    @model_validator(mode="after")
    def _known_expectation(self) -> ExpectationRule:
        if self.type not in EXPECTATIONS:
            field_problems(
                [
                    (
                        ("type",),
                        f"unknown Great Expectations expectation {self.type!r}{did_you_mean(self.type, EXPECTATIONS)}",
                    )
                ]
            )
        required, optional = EXPECTATIONS[self.type]
        allowed = (*required, *optional)
        problems: FieldProblems = [
            (
                ("kwargs", key),
                f"{self.type} takes no argument {key!r}{did_you_mean(key, allowed)}; "
                f"it takes {', '.join(allowed)}",
            )
            for key in self.kwargs
            if key not in allowed
        ]
        missing = [key for key in required if key not in self.kwargs]
        if missing:
            problems.append((("kwargs",), f"{self.type} needs {', '.join(missing)}"))
        field_problems(problems)
        return self


# Arrow type names as `str(pyarrow type)` prints them, plus the usual aliases; checked without
# importing pyarrow because configs are parsed in the DAG processor.
_ARROW_ALIASES = {
    "float64": "double",
    "float32": "float",
    "str": "string",
    "utf8": "string",
    "boolean": "bool",
}
_ARROW_TYPE = re.compile(
    r"^(u?int(8|16|32|64)|float|double|halffloat|string|large_string|binary|large_binary|bool|date32\[day\]|date64\[ms\]"
    r"|timestamp\[(s|ms|us|ns)(, tz=[A-Za-z0-9_/+-]+)?\]|decimal128\(\d+, \d+\)|dictionary<.+>)$"
)


def arrow_type_name(value: str) -> str:
    name = _ARROW_ALIASES.get(value, value)
    if not _ARROW_TYPE.match(name):
        raise ValueError(
            f"unknown Arrow type {value!r}; use e.g. int64, double, string, bool, timestamp[us], date32[day]"
        )
    return name


ArrowTypeName = Annotated[str, AfterValidator(arrow_type_name)]


def _spark_remote(value: str) -> str:
    """`sc://host:port`, without Spark Connect's `;token=`-style parameters (credentials)."""
    parts = urlsplit(value)
    if parts.scheme != "sc" or not parts.hostname:
        raise ValueError(f"expected a Spark Connect address sc://HOST:PORT, got {value!r}")
    if ";" in value or "@" in parts.netloc or parts.query:
        raise ValueError(
            "connection parameters (a token, a user) do not belong in the config; "
            "set the whole address in the worker's SPARK_REMOTE environment variable instead"
        )
    return value.rstrip("/")


SparkRemote = Annotated[
    str, AfterValidator(_spark_remote), Field(json_schema_extra={"examples": ["sc://spark-connect:15002"]})
]


class SchemaContract(Section):
    """Columns a snapshot must have, with their types: a renamed, dropped or retyped column fails fast."""

    columns: dict[ColumnName, ArrowTypeName] = {}
    """Required columns and their Arrow types (`int64`, `double`, `string`, `bool`, `timestamp[us]`, ...).
    Empty: the label, features and holdout key are required, typed like the previous validated snapshot."""

    allow_extra_columns: bool = False
    """Accept columns that are not in the contract (otherwise an unexpected column fails the check)."""


class VolumeRule(Section):
    """Row-count rules: too few rows, or a sudden change, usually means a broken upstream."""

    min_rows: NonNegativeInt = 1
    """Fewest rows a snapshot may have."""

    max_change: PositiveFloat | None = None
    """Largest relative change in rows vs the previous validated snapshot (0.5 = +/-50%)."""


class DriftRule(Section):
    """Per-feature distribution drift against a reference snapshot; a score above threshold fails."""

    numeric_method: Literal["psi", "ks"] = "psi"
    """Score for numeric features: `psi` (population stability index) or `ks` (KS statistic D)."""

    categorical_method: Literal["psi", "chi2"] = "psi"
    """Score for categorical features: `psi` or `chi2` (Cramer's V of the chi-square test)."""

    threshold: PositiveFloat = 0.2
    """Score above which a feature counts as drifted (PSI 0.2 is the usual 'significant')."""

    feature_thresholds: dict[ColumnName, PositiveFloat] = {}
    """Per-feature thresholds that replace `threshold` for the features named."""

    reference: Literal["previous", "champion"] = "previous"
    """Compare with the previous validated snapshot, or with the one the champion trained on."""


class TextRule(Section):
    """Checks of every text column (`data.features.text`), beside the expectations written on them."""

    max_empty_fraction: float = Field(default=0.2, ge=0.0, le=1.0)
    """Largest share of rows whose text is null or only whitespace."""

    max_unknown_fraction: float = Field(default=0.05, ge=0.0, le=1.0)
    """Largest share of a text's tokens the champion's tokenizer cannot read (`[UNK]`, WordPiece
    only): vocabulary the champion never saw is drift a length profile cannot show. Checked on the
    first 10,000 rows; skipped while there is no champion."""

    max_chars: PositiveInt | None = None
    """Longest text a row may hold, in characters; null: no limit (text past what `max_length`
    tokens can hold is never read anyway)."""


class ValidationSection(Section):
    """Checks run on each snapshot; a failure stops the run before training, without retries."""

    # `schema` would shadow BaseModel.schema(), hence the alias.
    contract: SchemaContract = Field(default=SchemaContract(), alias="schema")
    """Schema contract: required columns, their types, whether other columns may appear."""

    expectations: list[ExpectationRule] = []
    """Great Expectations expectations."""

    volume: VolumeRule = VolumeRule()
    """Row-count rules."""

    drift: DriftRule | None = None
    """Drift rule; leave out to skip drift checks. A text column drifts by its length in words
    (`numeric_method`)."""

    text: TextRule = TextRule()
    """Checks of the text columns: empty rows, unknown tokens, length."""

    fail_on: Literal["error", "never"] = Field(default="error")
    """`error` stops the pipeline on a failed check; `never` only reports (for a burn-in period)."""

    batch_rows: PositiveInt = 524_288
    """Rows per batch of the row-wise expectations (gathered from whole Parquet row groups, read
    one at a time); bounds the validator's memory. Larger batches run GX fewer times (~0.2 s each)."""

    engine: Literal["stream", "sql", "spark"] = "stream"
    """Where the checks run. `stream`: on the snapshot's files, read a row group at a time (GX on
    pandas batches). `sql` (only with a `data.source` of kind `sql`): the GX suite and the drift
    profiles run in the source's database over the run's window query (GX's SQL execution engine),
    and a COUNT there must equal the rows the export froze. `spark` (Parquet snapshots): the GX
    suite and the drift profiles run on a Spark Connect server over exactly the files the
    snapshot's manifest lists (GX's Spark execution engine; the JVM is the server's, the worker
    only sends plans and reads aggregates), and the rows Spark reads must equal the manifest's;
    needs the `spark` extra (`pip install airflow-trainpipe[spark]`). The schema contract and
    volume read the manifest with every engine. An expectation the chosen engine cannot run (per
    GX's metric registry; on `spark` also those that need a row order) is rejected when the
    config is checked."""

    spark_remote: SparkRemote | None = None
    """`engine: spark`: the Spark Connect server, `sc://HOST:PORT`. Leave out to use the worker's
    `SPARK_REMOTE` environment variable, Spark's own setting (one server per deployment rather
    than per pipeline, and the place for a URL that carries a token: a token is a credential and
    does not belong in a config). A config field rather than an Airflow connection: the
    `spark_connect` connection type comes with the apache-spark provider, which this package does
    not depend on. The server must be able to read the snapshot store (docs/data.md)."""

    @model_validator(mode="after")
    def _engine_runs_expectations(self) -> ValidationSection:
        field_problems(
            [
                (
                    ("expectations", index, "type"),
                    f"{rule.type} cannot run on validation.engine {self.engine!r} "
                    f"({_why_not(self.engine, rule.type)}); "
                    + (
                        f"it runs on engine {', '.join(map(repr, ENGINES[rule.type]))}"
                        if ENGINES[rule.type]
                        else "no engine here runs it"
                    ),
                )
                for index, rule in enumerate(self.expectations)
                if self.engine not in ENGINES.get(rule.type, (self.engine,))
            ]
        )
        return self


_GX_ENGINES = {"stream": "pandas", "sql": "SQLAlchemy", "spark": "Spark"}


def _why_not(engine: str, expectation: str) -> str:
    if expectation in ORDER_DEPENDENT.get(engine, ()):
        return (
            f"it compares each row with the one before, and rows have no defined order on engine {engine!r}"
        )
    return f"Great Expectations has no {_GX_ENGINES[engine]} implementation of its metrics"


def drift_threshold_problems(drift: DriftRule | None, columns: FeatureColumns) -> FieldProblems:
    """A per-feature drift threshold names a feature column: a typo would silently keep the default."""
    if drift is None:
        return []
    return [
        (
            ("validation", "drift", "feature_thresholds", name),
            f"{name!r} is not a feature in data.features{did_you_mean(name, columns.all)}",
        )
        for name in drift.feature_thresholds
        if name not in columns.all
    ]


def contract_coverage_problems(contract: SchemaContract, data: DataSection) -> FieldProblems:
    """A written schema contract lists every column the data section reads."""
    if not contract.columns:
        return []
    needed = [data.label, *data.features.all, *filter(None, [data.holdout.key_column, data.group])]
    missing = [name for name in needed if name not in contract.columns]
    if not missing:
        return []
    return [
        (
            ("validation", "schema", "columns"),
            f"the contract leaves out {', '.join(map(repr, missing))}, which data uses "
            "(label, features, holdout key, group)",
        )
    ]


def engine_problems(validation: ValidationSection, data: DataSection) -> FieldProblems:
    """`validation.engine` can read the data where it lies, and `spark_remote` is read by its engine."""
    engine = validation.engine
    rules = [
        (
            engine == "sql" and data.source.kind != "sql",
            "engine",
            "engine 'sql' runs the checks in the source's database: it needs a data.source of kind 'sql'",
        ),
        (
            engine == "spark" and data.format != "parquet",
            "engine",
            "engine 'spark' reads the snapshot's Parquet files: it needs data.format parquet",
        ),
        (
            engine == "spark" and data.freeze == "versions",
            "engine",
            "engine 'spark' reads files by path, and Hadoop's s3a cannot read a pinned object "
            "version: use data.freeze: true (copies) or engine stream",
        ),
        (
            data.feature_store is not None and engine == "sql",
            "engine",
            "engine 'sql' checks the query's rows in the database, but the run trains on them joined "
            "with the feature store's features: use engine stream (or spark), "
            "which reads the joined snapshot",
        ),
        (
            validation.spark_remote is not None and engine != "spark",
            "spark_remote",
            "only engine 'spark' reads spark_remote; set validation.engine: spark or remove it",
        ),
    ]
    return [(("validation", field), message) for broken, field, message in rules if broken]
