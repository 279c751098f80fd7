"""DataValidateOperator: the `validate_data` task. Bad data stops the run before training."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_trainpipe.config import PipelineConfig, as_config
from airflow_trainpipe.core.retry_policy import TrainpipeRetryPolicyMixin
from airflow_trainpipe.openlineage.reporting import OpenLineageReporting

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_trainpipe.contracts.manifest import Manifest
    from airflow_trainpipe.contracts.payloads import Check, ValidationSummary
    from airflow_trainpipe.data.validation.report import ValidationReport


class DataValidationFailed(AirflowFailException):
    """The data failed its checks: final (another try reads the same bytes), and its own alert."""


class DataValidateOperator(TrainpipeRetryPolicyMixin, OpenLineageReporting, BaseOperator):
    """Freeze the run's partition into a snapshot and run the config's checks on it.

    Checks: the schema contract, volume against the previous validated snapshot, the Great
    Expectations suite, and drift of each feature against the reference snapshot (the previous
    validated one, or the one the champion trained on). Writes `report.json` and GX Data Docs
    next to the snapshot, logs a table of the failures, and returns a summary. A failure raises
    DataValidationFailed (an AirflowFailException): retrying cannot fix bad data, so the task
    fails at once, and `notify` sends it as `validation_failure`.

    XCom: `return_value` is a ValidationSummary (contracts/payloads.py): the verdict, and the snapshot's
    manifest, whose files the train task must read (exactly these bytes).

    :param config: the parsed pipeline config, or the path of its YAML file.
    :param partition: sub-path of the run's snapshot (templated); default `data.partition`.
    :param conn_id: Airflow connection for the data's storage (e.g. `aws_default` for s3://).
    :param mlflow_conn_id: `mlflow` connection, read when drift compares with the champion's snapshot.
    """

    template_fields: Sequence[str] = ("partition", "conn_id")
    ui_color = "#fdebd0"

    def __init__(
        self,
        *,
        config: PipelineConfig | str,
        partition: str | None = None,
        conn_id: str | None = None,
        mlflow_conn_id: str | None = "mlflow_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.mlflow_conn_id = mlflow_conn_id
        self.config = as_config(config)
        self.partition = partition if partition is not None else self.config.data.partition
        self.conn_id = conn_id
        # What OpenLineage is told (openlineage/lineage.validation): the snapshot and its checks.
        self._lineage_manifest: Manifest | None = None
        self._lineage_checks: list[Check] = []

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_trainpipe.data.sources import source_kind

        if source_kind(self.config.data.source.kind).exported or self.config.data.feature_store is not None:
            return self._execute_frozen(context)
        from airflow_trainpipe.data.snapshots.manifests import (
            missing_partitions,
            resolve_snapshot,
            window_snapshot,
        )
        from airflow_trainpipe.data.window import run_partitions

        data = self.config.data
        window = run_partitions(data, context, self.partition, self.render_template)
        missing = missing_partitions(data, window, self.conn_id)
        manifest = resolve_snapshot(data, self.partition, self.conn_id)
        self._log_snapshot(manifest)
        earlier = self._earlier([p for p in window[:-1] if p not in missing])
        summary = self._checked(manifest, self.partition)
        if len(window) > 1:
            spanned = window_snapshot(data, [*earlier, (self.partition, manifest)], missing, self.conn_id)
            self.log.info(
                "window %s .. %s: snapshot %s of %d partition(s) (%d missing: %s), %d file(s), %d rows",
                window[0],
                window[-1],
                spanned.digest,
                len(spanned.window),
                len(missing),
                ", ".join(missing) or "-",
                len(spanned.files),
                spanned.rows,
            )
            summary = summary.model_copy(update={"manifest": spanned})
        if data.freeze is True:
            summary = summary.model_copy(update={"manifest": self._frozen(summary.manifest)})
        self._lineage_manifest = summary.manifest
        return summary.to_xcom()

    def _openlineage(self) -> Any:
        from airflow_trainpipe.openlineage import lineage

        return lineage.validation(self.config, self._lineage_manifest, self._lineage_checks)

    def _frozen(self, manifest: Manifest) -> Manifest:
        """`data.freeze`: the validated files copied into the snapshot store, checked byte for byte
        against what was validated as they are copied; training reads the copies."""
        from airflow_trainpipe.data.snapshots.store import freeze_manifest

        frozen = freeze_manifest(self.config, manifest, self.conn_id)
        self.log.info(
            "froze snapshot %s: %d file(s) into %s",
            frozen.digest,
            len(frozen.files),
            self.config.snapshots.uri,
        )
        return frozen

    def _execute_frozen(self, context: Context) -> dict[str, Any]:
        """A `sql`, `delta` or `iceberg` source, or any source joined with a feature store: the
        run's rows exported (joined) once into the snapshot store, then checked there (or, with
        `validation.engine: sql`, in the database over the query the export ran); training reads
        the same frozen files."""
        from airflow_trainpipe.data.freeze import freeze_run
        from airflow_trainpipe.data.sources import source_kind

        manifest = freeze_run(self.config, context, self.partition, self.render_template, self.conn_id)
        if manifest.source is not None:
            self.log.info(
                "exported %s .. %s from %s into the snapshot store",
                manifest.source.window_start,
                manifest.source.window_end,
                source_kind(manifest.source.kind).origin(manifest.source),
            )
        if manifest.features is not None:
            self.log.info(
                "joined %d feature(s) of Feast project %s (%s; definitions %s) as of %s",
                len(manifest.features.features),
                manifest.features.project,
                ", ".join(sorted(manifest.features.views)),
                manifest.features.definitions_sha256[:12],
                self.config.data.feature_store.timestamp_column if self.config.data.feature_store else "?",
            )
        self._log_snapshot(manifest)
        query = None
        if self.config.validation.engine == "sql":
            assert manifest.source is not None
            query = manifest.source.query  # the text the export ran
            self.log.info(
                "validation.engine sql: the expectations and drift profiles run in %s",
                manifest.source.conn_id,
            )
        return self._checked(manifest, self.partition, query).to_xcom()

    def _log_snapshot(self, manifest: Manifest) -> None:
        self.log.info(
            "snapshot %s: %d file(s), %d rows, %d columns",
            manifest.digest,
            len(manifest.files),
            manifest.rows,
            len(manifest.columns),
        )

    def _checked(self, manifest: Manifest, partition: str, query: str | None = None) -> ValidationSummary:
        """Validate the run's snapshot; bad data fails the task (unless `fail_on: never`).
        `query`: the window query the `sql` engine runs the expectations on."""
        summary, report = self._validate(manifest, partition, query)
        if not summary.passed:
            self.log.warning("%d check(s) failed:\n%s", len(summary.failures), report.failure_table())
            if self.config.validation.fail_on == "error":
                raise DataValidationFailed(
                    f"snapshot {manifest.digest} of {manifest.partition_uri} failed validation "
                    f"({report.failure_summary()}); nothing is trained on it. Report: {summary.report_uri}"
                )
            self.log.warning("validation.fail_on is 'never': continuing with the failed snapshot")
        return summary

    def _earlier(self, partitions: list[str]) -> list[tuple[str, Manifest]]:
        """The window's earlier partitions, oldest first, each with its validated manifest: the
        one its validation record names while the partition still holds those files, else
        validated now (oldest first, so each is checked against its predecessor, as on its day)."""
        from airflow_trainpipe.data.snapshots.manifests import resolve_snapshot

        earlier: list[tuple[str, Manifest]] = []
        validated_now = 0
        for partition in partitions:
            manifest = self._recorded(partition)
            if manifest is None:
                manifest = resolve_snapshot(self.config.data, partition, self.conn_id)
                self.log.info(
                    "window partition %s has no current validation record: validating it now", partition
                )
                summary, report = self._validate(manifest, partition)
                validated_now += 1
                if not summary.passed and self.config.validation.fail_on == "error":
                    raise DataValidationFailed(
                        f"partition {partition} of the window failed validation ({report.failure_summary()}); "
                        f"nothing is trained on the window. Report: {summary.report_uri}"
                    )
            earlier.append((partition, manifest))
        self.log.info(
            "window: %d earlier partition(s), %d reused their validation records, %d validated now",
            len(partitions),
            len(partitions) - validated_now,
            validated_now,
        )
        return earlier

    def _recorded(self, partition: str) -> Manifest | None:
        """The manifest a usable validation record of `partition` names, while the partition still
        holds exactly those files (a listing and a stat per file); None when it must be validated."""
        from airflow_trainpipe.data.snapshots.errors import SnapshotError
        from airflow_trainpipe.data.snapshots.manifests import is_current, load_manifest
        from airflow_trainpipe.data.validation import history

        data = self.config.data
        record = history.at(data, self.config.pipeline, partition, self.conn_id)
        if record is None or not (record.get("passed", True) or self.config.validation.fail_on == "never"):
            return None
        try:
            kept = load_manifest(data, record["digest"], self.conn_id)
        except SnapshotError:
            return None
        return kept if is_current(kept, self.conn_id) else None

    def _validate(
        self, manifest: Manifest, partition: str, query: str | None = None
    ) -> tuple[ValidationSummary, ValidationReport]:
        """Run the checks, write the report, record a usable snapshot in the history."""
        from airflow_trainpipe.contracts.payloads import ReferenceSnapshot, ValidationSummary
        from airflow_trainpipe.data.validation import history
        from airflow_trainpipe.data.validation.validate import (
            history_payload,
            validate_snapshot,
            write_report,
        )

        config, data = self.config, self.config.data
        if config.validation.engine == "spark":
            from airflow_trainpipe.data.validation.spark_connect import spark_remote

            self.log.info(
                "validation.engine spark: the expectations and drift profiles run on %s", spark_remote(config)
            )
        previous = history.previous(data, config.pipeline, partition, self.conn_id)
        report = validate_snapshot(
            config,
            partition,
            manifest,
            reference=self._reference(previous),
            previous=previous,
            conn_id=self.conn_id,
            query=query,
        )
        report.checks += self._vocabulary_checks(manifest, report)
        self._lineage_manifest, self._lineage_checks = manifest, report.checks
        written = write_report(report, self.conn_id)
        self.log.info("report: %s", written["report"])
        if "data_docs" in written:
            self.log.info("Great Expectations Data Docs: %s", written["data_docs"])
        if report.drift_scores:
            self.log.info(
                "drift vs %s: %s",
                report.reference["partition"] if report.reference else "-",
                ", ".join(f"{k}={v:.4f}" for k, v in report.drift_scores.items()),
            )
        if report.passed:
            self.log.info("all %d check(s) passed", len(report.checks))
        if report.passed or config.validation.fail_on == "never":
            history.record(data, config.pipeline, partition, history_payload(report), self.conn_id)
        return ValidationSummary(
            passed=report.passed,
            manifest=manifest,
            drift=report.drift_scores,
            reference=ReferenceSnapshot.model_validate(report.reference) if report.reference else None,
            failures=report.failures,
            report_uri=written["report"],
            data_docs_uri=written.get("data_docs"),
        ), report

    def _reference(self, previous: dict[str, Any] | None) -> dict[str, Any] | None:
        drift = self.config.validation.drift
        if drift is None or drift.reference == "previous":
            return previous
        record, why_not = self._champion_record
        if record is None:
            self.log.warning(
                "drift reference 'champion': %s; comparing with the previous validated snapshot instead",
                why_not,
            )
            return previous
        return {**record, "reference_kind": "champion"}

    @cached_property
    def _champion_record(self) -> tuple[dict[str, Any] | None, str]:
        """The validation record of the champion's data, once per task (a window validates many
        partitions), and why there is none. A window's snapshot has no record of its own: its
        newest partition's, the one validated on the champion's day, stands for it."""
        from airflow_trainpipe.data.snapshots.errors import SnapshotError
        from airflow_trainpipe.data.snapshots.manifests import load_manifest
        from airflow_trainpipe.data.validation import history

        data, pipeline = self.config.data, self.config.pipeline
        digest = self._champion_data_digest()
        if digest is None:
            return None, "no champion yet"
        record = history.by_digest(data, pipeline, digest, self.conn_id)
        if record is None:
            try:
                window = load_manifest(data, digest, self.conn_id).window
            except SnapshotError:
                window = []
            record = history.at(data, pipeline, window[-1], self.conn_id) if window else None
        return record, f"the champion's snapshot {digest} was never validated here"

    def _champion_data_digest(self) -> str | None:
        """The data digest the current champion was trained on (a lineage tag of its version).

        None only when the registry says there is no champion; a registry that cannot be read
        fails the task (retried) rather than silently comparing with another snapshot.
        """
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.registry.reads import RegistryUnavailable, champion_data_digest

        try:
            return MlflowHook(self.mlflow_conn_id).call(
                champion_data_digest, self.config.registered_model_name, self.config.registration.alias
            )
        except RegistryUnavailable as exc:
            raise AirflowException(f"drift reference 'champion': {exc}") from exc

    def _vocabulary_checks(self, manifest: Manifest, report: ValidationReport) -> list[Check]:
        """The snapshot's text read by the champion's tokenizer (`validation.text`): its first
        10,000 rows, whose tokens the champion cannot read. None while there is no champion or
        when a text column is already reported broken; a registry that cannot be asked fails the
        task (retried), a champion whose tokenizer cannot be read fails the check."""
        from airflow_trainpipe.contracts.payloads import Check
        from airflow_trainpipe.data.validation.validate import first_rows
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.registry.reads import RegistryError, RegistryUnavailable, champion_transform

        text = self.config.data.features.text
        broken = {c.column for c in report.checks if c.kind == "schema" and not c.passed}
        if not text or broken & set(text) or not set(text) <= set(manifest.columns):
            return []
        try:
            champion = MlflowHook(self.mlflow_conn_id).call(
                champion_transform, self.config.registered_model_name, self.config.registration.alias
            )
        except RegistryUnavailable:
            raise
        except RegistryError as exc:
            return [
                Check(
                    "text", "unknown_tokens", text[0], False, "unreadable", "a readable tokenizer", str(exc)
                )
            ]
        if champion is None:
            return []
        from airflow_trainpipe.runtime.data.text import unknown_token_checks

        rows = first_rows(manifest, list(text), 10_000, self.conn_id)
        return unknown_token_checks(champion, rows, self.config.validation.text.max_unknown_fraction)
