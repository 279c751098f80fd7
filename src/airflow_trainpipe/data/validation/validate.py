"""Validate one snapshot: schema contract, volume, GX expectations and drift, in one read; the
report written next to it (report.json, Data Docs) and what the validation history keeps of it.

`validation.engine` picks where the expectations and the drift profiles run: here, streamed (the
default), in the source's database (`sql_engine`) or on a Spark Connect server (`spark_engine`);
the schema contract and volume checks are answered from the manifest (`checks`) in every case.

The data is read once, a Parquet row group at a time, with only the columns some check needs.
The drift profiles consume each row group; row-wise expectations run on batches of about
`validation.batch_rows` rows of the columns they read. Only expectations that need a whole column
read their columns in full (see expectations.py), so memory is bounded by one batch plus those.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from airflow_trainpipe.config.pipeline import PipelineConfig
from airflow_trainpipe.config.validation import TextRule
from airflow_trainpipe.contracts.manifest import Manifest
from airflow_trainpipe.contracts.payloads import Check
from airflow_trainpipe.core.storage import filesystem, is_local, join, local_path
from airflow_trainpipe.data.snapshots.partitions import STATE_DIR
from airflow_trainpipe.data.validation.checks import schema_checks, volume_checks
from airflow_trainpipe.data.validation.drift import (
    CategoricalAccumulator,
    NumericAccumulator,
    TextAccumulator,
    categorical_score,
    numeric_score,
    reference_edges,
)
from airflow_trainpipe.data.validation.engines import expectation_check
from airflow_trainpipe.data.validation.expectations import ExpectationRunner, columns_of
from airflow_trainpipe.data.validation.report import ValidationReport

NUMERIC_TYPES = ("int", "uint", "float", "double", "halffloat", "decimal")


def _is_numeric(arrow_type: str) -> bool:
    return arrow_type.startswith(NUMERIC_TYPES)


def _tables(manifest: Manifest, columns: list[str], conn_id: str | None) -> Iterator[Any]:
    """The snapshot in pieces: Parquet row groups, or CSV blocks."""
    import pyarrow as pa

    for entry in manifest.files:
        # Local files go to Arrow's native reader (threaded I/O); others through fsspec.
        fs, path = filesystem(entry.uri, conn_id)
        with open(local_path(entry.uri), "rb") if is_local(entry.uri) else fs.open(path, "rb") as handle:
            if manifest.format == "parquet":
                yield from _row_groups(handle, columns)
            else:
                import pyarrow.csv as pcsv

                options = pcsv.ConvertOptions(include_columns=columns)
                for batch in pcsv.open_csv(handle, convert_options=options):
                    yield pa.Table.from_batches([batch])


def first_rows(manifest: Manifest, columns: list[str], rows: int, conn_id: str | None = None) -> Any:
    """The snapshot's first `rows` rows of `columns` (a pyarrow Table), read a row group at a time."""
    import pyarrow as pa

    tables, read = [], 0
    for table in _tables(manifest, columns, conn_id):
        tables.append(table)
        read += table.num_rows
        if read >= rows:
            break
    return (
        pa.concat_tables(tables).slice(0, rows)
        if tables
        else pa.table({c: pa.array([], pa.string()) for c in columns})
    )


def _row_groups(handle: Any, columns: list[str]) -> Iterator[Any]:
    """One Parquet row group at a time.

    ParquetFile.iter_batches reads ahead across row groups: on a 1M-row file its Arrow pool peaked
    at ~2x the decoded data whatever the batch size; decoding a row group alone peaks at ~3x that
    row group, so reading one at a time keeps the reader's memory small and fixed.
    """
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(handle)
    for index in range(parquet.num_row_groups):
        yield parquet.read_row_group(index, columns=columns)


def _whole(manifest: Manifest, columns: list[str], conn_id: str | None) -> Any:
    import pyarrow as pa

    return pa.concat_tables(list(_tables(manifest, columns, conn_id))).to_pandas()


def validate_snapshot(
    config: PipelineConfig,
    partition: str,
    manifest: Manifest,
    *,
    reference: dict[str, Any] | None,
    previous: dict[str, Any] | None,
    conn_id: str | None = None,
    query: str | None = None,
) -> ValidationReport:
    """Run every configured check; `reference` is the drift baseline, `previous` the volume one
    (both validated-snapshot records from history.py, or None). With `validation.engine: sql`,
    `query` is the run's rendered window query: the expectations run on it in the database; with
    `spark`, they run on a Spark Connect server over the manifest's files."""
    report = ValidationReport(config.pipeline, partition, manifest, reference=_describe(reference))
    report.checks += schema_checks(config, manifest.columns, previous)
    report.checks += volume_checks(config, manifest.rows, previous)
    broken = _broken_columns(config, manifest, report.checks)
    runnable = [s for s in config.validation.expectations if not any(c in broken for c in columns_of(s))]
    for spec in config.validation.expectations:
        if spec not in runnable:
            column = next(c for c in columns_of(spec) if c in broken)
            report.checks.append(
                Check(
                    "expectation",
                    spec.type,
                    column,
                    False,
                    "not run",
                    spec.kwargs,
                    f"{spec.type} not run: {broken[column]}",
                )
            )
    profiles = (reference or {}).get("profiles", {})
    accumulators = _accumulators(config, manifest, broken, profiles)
    # Text profiles are read from the snapshot's files whatever the engine (the frozen export is
    # Parquet too): with `stream` in its one pass, otherwise in a pass of the text columns alone.
    text = {n: a for n, a in accumulators.items() if isinstance(a, TextAccumulator)}
    tabular = {n: a for n, a in accumulators.items() if n not in text}
    if config.validation.engine == "sql" and query is not None:
        from airflow_trainpipe.data.validation.sql_engine import checks_in_database

        report.checks += checks_in_database(config, manifest, runnable, query, report, tabular)
        _stream(config, manifest, text, None, conn_id)
    elif config.validation.engine == "spark":
        from airflow_trainpipe.data.validation.spark_engine import checks_in_spark

        report.checks += checks_in_spark(config, manifest, runnable, report, tabular)
        _stream(config, manifest, text, None, conn_id)
    else:
        report.checks += _in_files(config, manifest, runnable, report, accumulators, conn_id)
    report.profiles = {name: acc.profile() for name, acc in accumulators.items()}
    report.checks += text_checks(config.validation.text, text)
    if config.validation.drift is not None and report.reference is not None:
        report.checks += _drift_checks(config.validation.drift, accumulators, profiles, report)
    return report


def text_checks(rule: TextRule, accumulators: dict[str, TextAccumulator]) -> list[Check]:
    """Blank rows and the longest text of each text column."""
    checks = []
    for name, text in accumulators.items():
        blank = text.blank / max(text.rows, 1)
        checks.append(
            Check(
                "text",
                "blank_fraction",
                name,
                blank <= rule.max_empty_fraction,
                round(blank, 6),
                f"<= {rule.max_empty_fraction}",
                f"{name}: {text.blank} of {text.rows} row(s) hold no text (null or blank)",
            )
        )
        if rule.max_chars is not None:
            checks.append(
                Check(
                    "text",
                    "max_chars",
                    name,
                    text.longest <= rule.max_chars,
                    text.longest,
                    f"<= {rule.max_chars}",
                    f"{name}: the longest text holds {text.longest} character(s)",
                )
            )
    return checks


def _in_files(
    config: PipelineConfig,
    manifest: Manifest,
    rules: list[Any],
    report: ValidationReport,
    accumulators: dict[str, Any],
    conn_id: str | None,
) -> list[Check]:
    """`engine: stream`: one read of the files feeds the drift profiles and GX's batches; the
    expectations that need whole columns then run on just those columns."""
    runner = ExpectationRunner(rules) if rules else None
    _stream(config, manifest, accumulators, runner, conn_id)
    if runner is None:
        return []
    if runner.whole:
        needed = sorted({c for s in runner.whole for c in columns_of(s)})
        table_level = any(not columns_of(s) for s in runner.whole)
        runner.run_whole(
            _whole(manifest, list(manifest.columns) if table_level or not needed else needed, conn_id)
        )
    outcomes = runner.outcomes()
    report.data_docs_html = runner.data_docs_html(outcomes)
    return [expectation_check(o) for o in outcomes]


def _broken_columns(config: PipelineConfig, manifest: Manifest, checks: list[Check]) -> dict[str, str]:
    """Columns missing or retyped, with the reason. The schema check reports them; expectations and
    drift on them are reported as not run instead of failing on a type error that hides the cause."""
    present = manifest.columns
    broken = {
        c.column: c.message for c in checks if c.kind == "schema" and not c.passed and c.column in present
    }
    broken.update(
        {
            c: f"column {c!r} is missing"
            for s in config.validation.expectations
            for c in columns_of(s)
            if c not in present
        }
    )
    return broken


def _accumulators(
    config: PipelineConfig, manifest: Manifest, broken: dict[str, str], profiles: dict[str, Any]
) -> dict[str, NumericAccumulator | CategoricalAccumulator]:
    """One profile builder per usable feature, counting at the reference's edges when there are any."""
    present, features, drift = manifest.columns, config.data.features, config.validation.drift
    accumulators: dict[str, NumericAccumulator | CategoricalAccumulator] = {}
    for name in features.all:
        if name not in present or name in broken:
            continue
        if name in features.numeric and _is_numeric(present[name]):
            ref = profiles.get(name)
            counted = (
                reference_edges(drift.numeric_method, ref)
                if drift is not None and ref and ref.get("kind") == "numeric" and ref["edges"]
                else None
            )
            accumulators[name] = NumericAccumulator(manifest.rows, counted)
        elif name in features.categorical:
            accumulators[name] = CategoricalAccumulator()
        elif name in features.text:
            ref = profiles.get(name)
            counted = (
                reference_edges(drift.numeric_method, ref)
                if drift is not None and ref and ref.get("kind") == "text" and ref["edges"]
                else None
            )
            accumulators[name] = TextAccumulator(manifest.rows, counted)
    return accumulators


def _stream(
    config: PipelineConfig,
    manifest: Manifest,
    accumulators: dict[str, Any],
    runner: ExpectationRunner | None,
    conn_id: str | None,
) -> None:
    """The one read: each row group feeds the drift profiles at once; GX gets batches of them.

    GX has a fixed cost per run (~0.2 s to plan its metrics), so its batches gather several row
    groups, holding only the columns it reads.
    """
    import pyarrow as pa

    gx = runner if runner is not None and runner.streamed else None
    gx_columns = sorted({c for s in (gx.streamed if gx is not None else []) for c in columns_of(s)})
    columns = sorted({*accumulators, *gx_columns})
    if not columns:
        return
    pending: list[Any] = []
    pending_rows = 0
    for table in _tables(manifest, columns, conn_id):
        for name, accumulator in accumulators.items():
            accumulator.add(table[name])
        if gx is not None:
            pending.append(table.select(gx_columns))
            pending_rows += table.num_rows
        del table
        if gx is not None and pending and pending_rows >= config.validation.batch_rows:
            # pandas only for the columns GX reads: strings as Python objects cost far more than Arrow
            gx.add_batch(pa.concat_tables(pending).to_pandas())
            pending, pending_rows = [], 0
    if pending and gx is not None:
        gx.add_batch(pa.concat_tables(pending).to_pandas())


def _drift_checks(
    drift: Any, accumulators: dict[str, Any], profiles: dict[str, Any], report: ValidationReport
) -> list[Check]:
    checks = []
    reference_partition = (report.reference or {}).get("partition")
    for name, accumulator in accumulators.items():
        ref = profiles.get(name)
        if ref is None or ref.get("kind") != report.profiles[name]["kind"]:
            continue
        if isinstance(accumulator, NumericAccumulator):
            if accumulator.at_or_below is None:
                continue
            method, score = drift.numeric_method, numeric_score(drift.numeric_method, ref, accumulator)
        else:
            method = drift.categorical_method
            score = categorical_score(method, ref, report.profiles[name])
        score = round(score, 6)
        threshold = drift.feature_thresholds.get(name, drift.threshold)
        checks.append(
            Check(
                "drift",
                method,
                name,
                score <= threshold,
                score,
                f"<= {threshold}",
                f"{name}: {method} {score:.4f} vs {reference_partition} (threshold {threshold})",
            )
        )
    return checks


def _describe(reference: dict[str, Any] | None) -> dict[str, Any] | None:
    if reference is None:
        return None
    return {
        "partition": reference["partition"],
        "digest": reference["digest"],
        "rows": reference["rows"],
        "kind": reference.get("reference_kind", "previous"),
    }


def history_payload(report: ValidationReport) -> dict[str, Any]:
    manifest = report.manifest
    return {
        "digest": manifest.digest,
        "rows": manifest.rows,
        "columns": manifest.columns,
        "profiles": report.profiles,
        "passed": report.passed,
    }


def write_report(report: ValidationReport, conn_id: str | None = None) -> dict[str, str]:
    """The JSON report and GX Data Docs page next to the snapshot; returns their URIs."""
    folder = join(report.manifest.partition_uri, STATE_DIR, report.pipeline, report.manifest.short_digest)
    fs, base = filesystem(folder, conn_id)
    fs.makedirs(base, exist_ok=True)
    written = {"report": join(folder, "report.json")}
    fs.pipe_file(f"{base}/report.json", json.dumps(report.to_dict(), indent=1, default=str).encode())
    if report.data_docs_html is not None:
        written["data_docs"] = join(folder, "data_docs.html")
        fs.pipe_file(f"{base}/data_docs.html", report.data_docs_html.encode())
    return written
