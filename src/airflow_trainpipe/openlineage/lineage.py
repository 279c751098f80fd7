"""What each task reports to OpenLineage, built from what the task already has (its payloads).

- validate_data: in, the source as it was read (its partitions, its table at the version read,
  the Feast feature views joined), with the schema and each check as a data-quality assertion;
  out, the frozen snapshot.
- train (and each tuning trial): in, the snapshot (and the pretrained directory or registered version
  a fine-tune started from, at its pinned sha256); out, the MLflow run's model.
- gate: in, the candidate's model and the champion's version; the decision as a run facet.
- register / promote: in, the run's model and the snapshot it was trained on; out, the model
  version, with the alias it now holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    data_quality_assertions_dataset,
    dataset_version_dataset,
    input_statistics_input_dataset,
    output_statistics_output_dataset,
    schema_dataset,
)

from airflow_trainpipe.openlineage.facets import (
    TrainpipeGateRunFacet,
    TrainpipeModelDatasetFacet,
    TrainpipeSnapshotDatasetFacet,
)
from airflow_trainpipe.openlineage.naming import (
    model_version_name,
    pretrained_name,
    run_model_name,
    snapshot_name,
    tracking_namespace,
)

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.contracts.manifest import Manifest
    from airflow_trainpipe.contracts.payloads import Check, GateDecision, TrainResult


def validation(config: PipelineConfig, manifest: Manifest | None, checks: list[Check]) -> OperatorLineage:
    """The source read, its checks as assertions, and the snapshot (none before it was frozen)."""
    from airflow_trainpipe.data.sources import source_kind

    if manifest is None:
        return OperatorLineage()
    assertions = data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet(
        assertions=[_assertion(check) for check in checks]
    )
    inputs = [
        InputDataset(
            namespace=source.namespace,
            name=source.name,
            facets={
                "schema": _schema(manifest),
                **(
                    {
                        "version": dataset_version_dataset.DatasetVersionDatasetFacet(
                            datasetVersion=source.version
                        )
                    }
                    if source.version is not None
                    else {}
                ),
            },
            inputFacets={
                "dataQualityAssertions": assertions,
                "inputStatistics": input_statistics_input_dataset.InputStatisticsInputDatasetFacet(
                    rowCount=manifest.rows
                ),
            },
        )
        for source in source_kind(config.data.source.kind).lineage_datasets(config.data, manifest)
    ]
    if manifest.features is not None:
        project = manifest.features.project
        inputs += [
            InputDataset(namespace=f"feast://{project}", name=view)
            for view in sorted(manifest.features.views)
        ]
    return OperatorLineage(inputs=inputs, outputs=[snapshot_output(config, manifest)])


def training(
    config: PipelineConfig, manifest: Manifest | None, result: TrainResult | None, tracking_uri: str
) -> OperatorLineage:
    """The snapshot in; the run's model out, once there is one (not before, nor for a rung)."""
    inputs = [snapshot_input(config, manifest)] if manifest is not None else []
    if result is not None and result.pretrained is not None:
        inputs.append(
            InputDataset(
                *pretrained_name(result.pretrained["source"], tracking_uri),
                facets={
                    "version": dataset_version_dataset.DatasetVersionDatasetFacet(
                        datasetVersion=result.pretrained["sha256"]
                    )
                },
            )
        )
    outputs = []
    if result is not None and result.model_uri is not None:
        outputs.append(
            OutputDataset(
                namespace=tracking_namespace(tracking_uri),
                name=run_model_name(result.mlflow_run_id),
                facets={
                    "trainpipe_model": TrainpipeModelDatasetFacet(
                        mlflowRunId=result.mlflow_run_id,
                        dataDigest=manifest.digest if manifest is not None else None,
                        modelUri=result.model_uri,
                        transformHash=result.transform_hash,
                        metrics=_finite(result.holdout_metrics),
                    )
                },
            )
        )
    return OperatorLineage(inputs=inputs, outputs=outputs)


def gate(config: PipelineConfig, decision: GateDecision | None, tracking_uri: str) -> OperatorLineage:
    if decision is None:
        return OperatorLineage()
    namespace = tracking_namespace(tracking_uri)
    inputs = []
    if decision.mlflow_run_id:
        inputs.append(InputDataset(namespace=namespace, name=run_model_name(decision.mlflow_run_id)))
    if decision.champion_version:
        name = model_version_name(config.registered_model_name, decision.champion_version)
        inputs.append(InputDataset(namespace=namespace, name=name))
    facet = TrainpipeGateRunFacet(
        promote=decision.promote,
        reason=decision.reason,
        metric=decision.metric,
        direction=decision.direction,
        candidate=decision.candidate,
        champion=decision.champion,
        championVersion=decision.champion_version,
        improvement=decision.improvement,
        improvementInterval=list(decision.improvement_interval) if decision.improvement_interval else None,
        confidence=decision.confidence,
        failedGuardrails=[g.metric for g in decision.guardrails if not g.passed] or None,
        failedSlices=[f"{s.slice}:{s.metric}" for s in decision.slice_checks if not s.passed] or None,
        forced=decision.forced,
    )
    return OperatorLineage(inputs=inputs, run_facets={"trainpipe_gate": facet})


def registration(
    config: PipelineConfig, registered: dict[str, Any] | None, tracking_uri: str
) -> OperatorLineage:
    """`registered`: what register (or promote) returned; the version it names is the output."""
    if not registered:
        return OperatorLineage()
    namespace = tracking_namespace(tracking_uri)
    run_id, digest = registered["mlflow_run_id"], registered.get("data_digest")
    inputs = [InputDataset(namespace=namespace, name=run_model_name(run_id))]
    if digest:
        inputs.append(InputDataset(*snapshot_name(config, digest)))
    version = OutputDataset(
        namespace=namespace,
        name=model_version_name(registered["model_name"], str(registered["version"])),
        facets={
            "trainpipe_model": TrainpipeModelDatasetFacet(
                mlflowRunId=run_id,
                dataDigest=digest,
                modelUri=registered.get("model_uri"),
                modelName=registered["model_name"],
                version=str(registered["version"]),
                alias=registered.get("alias"),
                promoted=registered.get("promoted"),
                previousVersion=registered.get("previous_version"),
            )
        },
    )
    return OperatorLineage(inputs=inputs, outputs=[version])


def snapshot_input(config: PipelineConfig, manifest: Manifest) -> InputDataset:
    namespace, name = snapshot_name(config, manifest.digest)
    return InputDataset(namespace=namespace, name=name, facets=_snapshot_facets(config, manifest))


def snapshot_output(config: PipelineConfig, manifest: Manifest) -> OutputDataset:
    namespace, name = snapshot_name(config, manifest.digest)
    statistics = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
        rowCount=manifest.rows, size=sum(f.size for f in manifest.files), fileCount=len(manifest.files)
    )
    return OutputDataset(
        namespace=namespace,
        name=name,
        facets=_snapshot_facets(config, manifest),
        outputFacets={"outputStatistics": statistics},
    )


def _snapshot_facets(config: PipelineConfig, manifest: Manifest) -> dict[str, Any]:
    from airflow_trainpipe.data.sources import source_kind

    source = manifest.source
    features = manifest.features
    return {
        "schema": _schema(manifest),
        "version": dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=manifest.digest),
        "trainpipe_snapshot": TrainpipeSnapshotDatasetFacet(
            digest=manifest.digest,
            rows=manifest.rows,
            files=len(manifest.files),
            sourceKind=config.data.source.kind,
            origin=source_kind(source.kind).origin(source) if source is not None else manifest.partition_uri,
            window=manifest.window or None,
            missing=manifest.missing or None,
            featureProject=features.project if features is not None else None,
            features=features.features if features is not None else None,
        ),
    }


def _schema(manifest: Manifest) -> schema_dataset.SchemaDatasetFacet:
    return schema_dataset.SchemaDatasetFacet(
        fields=[
            schema_dataset.SchemaDatasetFacetFields(name=name, type=arrow_type, ordinal_position=i)
            for i, (name, arrow_type) in enumerate(manifest.columns.items(), start=1)
        ]
    )


def _assertion(check: Check) -> data_quality_assertions_dataset.Assertion:
    return data_quality_assertions_dataset.Assertion(
        assertion=check.name,
        success=bool(check.passed),
        column=check.column,
        severity="error",
        name=f"{check.kind}:{check.name}" + (f"({check.column})" if check.column else ""),
        description=check.message or None,
        expected=_text(check.expected),
        actual=_text(check.observed),
    )


def _text(value: Any) -> str | None:
    """A check's expected or observed value as the facet's text: JSON, cut at 1,000 characters."""
    import json

    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:1000]


def _finite(metrics: dict[str, float]) -> dict[str, float]:
    import math

    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
