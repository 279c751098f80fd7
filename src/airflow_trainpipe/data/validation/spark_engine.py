"""`validation.engine: spark`: the Great Expectations suite and the drift profiles on a Spark
Connect server, over exactly the Parquet files the snapshot's manifest lists.

The JVM runs in the Connect server (a cluster's driver in production, or a local one), not in
the Airflow worker: the worker holds a thin gRPC client that sends plans and reads aggregates.
GX's Spark execution engine runs each expectation as DataFrame aggregations; the drift profiles
are Spark aggregates that fill the same accumulators the streamed pass fills (so drift.py judges
them the same way); a count of the rows Spark reads must equal the manifest's. No row of the
snapshot reaches the worker but the bounded strided sample the numeric percentiles are taken
from (at most drift.SAMPLE_ROWS values a feature, whatever the snapshot's size).

The server reads the files itself, so it must reach the snapshot store: a file:// store only on
the same machine (tests, a local server), s3:// as s3a:// (hadoop-aws and credentials configured
on the server; docs/data.md). pyspark is imported here only, inside functions: it is the
`spark` extra, and DAG parsing never imports this module.

GX 1.24 on Spark Connect: its Spark metrics call pyspark.sql.functions, which use the Connect
implementation only once pyspark knows it is in Connect mode (`SPARK_CONNECT_MODE_ENABLED`); the
classic builder's `remote(...).create()` sets it, the Connect builder does not (every metric then
failed on `SparkContext._active_spark_context`). The quantile expectation's numpy.bool_ success
is handled by the shared runner (engines.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_trainpipe.config.pipeline import PipelineConfig
from airflow_trainpipe.config.validation import ExpectationRule
from airflow_trainpipe.contracts.manifest import Manifest
from airflow_trainpipe.contracts.payloads import Check
from airflow_trainpipe.data.validation.engines import WholeSuiteRunner, rows_check, suite_checks
from airflow_trainpipe.data.validation.spark_connect import SparkConnect

if TYPE_CHECKING:
    from airflow_trainpipe.data.validation.report import ValidationReport


class SparkExpectationRunner(WholeSuiteRunner):
    """The suite on one Spark DataFrame (the snapshot's files), run once on the server. GX would
    persist the batch (cache it in the server's memory) for its metrics; it reads the Parquet
    columns each metric bundle needs instead, so the server's memory does not grow with the
    snapshot."""

    def __init__(self, rules: list[ExpectationRule], frame: Any) -> None:
        self.frame = frame
        super().__init__(rules)

    def _batch_definition(self) -> Any:
        source = self.context.data_sources.add_spark(self.name, persist=False)
        return source.add_dataframe_asset("snapshot").add_batch_definition_whole_dataframe("batch")

    def _frame(self) -> Any:
        return self.frame


def checks_in_spark(
    config: PipelineConfig,
    manifest: Manifest,
    rules: list[ExpectationRule],
    report: ValidationReport,
    accumulators: dict[str, Any],
) -> list[Check]:
    """The suite and the drift profiles on the Spark Connect server, and the rows Spark reads
    from the manifest's files against the manifest's count."""
    from airflow_trainpipe.data.validation.spark_profiles import fill_profiles

    with SparkConnect(config) as spark:
        frame = spark.read(manifest.file_uris)
        checks = [
            rows_check(
                "files_unchanged",
                fill_profiles(spark, manifest, accumulators),
                manifest.rows,
                f"Spark reads from the manifest's {len(manifest.files)} file(s)",
                "a file changed after the snapshot was taken; validate again",
            )
        ]
        if rules:
            checks += suite_checks(SparkExpectationRunner(rules, frame), report)
            if not all(c.passed for c in checks[1:]):
                spark.probe()  # GX reports a metric that failed as a failed expectation: was it the server?
    return checks
