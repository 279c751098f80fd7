"""openlineage.lineage: what each task reports, built from its payloads, and valid against the
spec (each facet against its own schema, ours against facets.json)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow.providers.openlineage")

from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
from openlineage.client.serde import Serde

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.contracts.manifest import Manifest, SourceLineage
from airflow_trainpipe.contracts.payloads import Check, GateDecision, GuardrailCheck
from airflow_trainpipe.core.digest import combine
from airflow_trainpipe.openlineage import lineage
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.openlineage import facets_of, schema_errors

SHAS = ["a" * 64, "b" * 64]


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path))
    return parse_config((EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text())


def _manifest(root: Path, days: tuple[str, ...] = ("2026-01-02",), **changes: Any) -> Manifest:
    files = [
        {"uri": f"{(root / f'ds={day}').as_uri()}/part-0.parquet", "size": 10, "sha256": sha, "rows": 50}
        for day, sha in zip(days, SHAS, strict=False)
    ]
    return Manifest.model_validate(
        {
            "partition_uri": (root / f"ds={days[-1]}").as_uri(),
            "format": "parquet",
            "files": files,
            "rows": 50 * len(files),
            "columns": {"amount": "double", "merchant": "string"},
            "digest": combine(SHAS[: len(files)]),
            **changes,
        }
    )


def _event(operator_lineage: Any, state: RunState = RunState.COMPLETE) -> dict[str, Any]:
    event = RunEvent(
        eventType=state,
        eventTime=datetime.now(UTC).isoformat(),
        run=Run(runId=str(uuid.uuid4()), facets=operator_lineage.run_facets),
        job=Job(namespace="trainpipe-tests", name="fraud_detector.validate_data"),
        producer="https://github.com/apache/airflow/tree/providers-openlineage/2.20.3",
        inputs=operator_lineage.inputs,
        outputs=operator_lineage.outputs,
    )
    return Serde.to_dict(event)


def test_validation_names_the_partitions_read_and_the_snapshot_by_its_digest(
    config: Any, tmp_path: Path
) -> None:
    data = tmp_path / config.data.uri
    manifest = _manifest(data, days=("2026-01-01", "2026-01-02"), window=["ds=2026-01-01", "ds=2026-01-02"])
    checks = [
        Check("volume", "min_rows", None, True, 100, {"min": 10}, ""),
        Check("expectation", "expect_column_values_to_not_be_null", "amount", False, 3, 0, "3 nulls"),
    ]
    event = _event(lineage.validation(config, manifest, checks))
    assert schema_errors(event) == []
    assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [
        ("file", str(data / "ds=2026-01-01")),
        ("file", str(data / "ds=2026-01-02")),
    ]
    first = facets_of(event["inputs"][0])
    assert [f["name"] for f in first["schema"]["fields"]] == ["amount", "merchant"]
    assert first["inputStatistics"]["rowCount"] == 100
    assertions = first["dataQualityAssertions"]["assertions"]
    assert [(a["assertion"], a["success"], a.get("column")) for a in assertions] == [
        ("min_rows", True, None),
        ("expect_column_values_to_not_be_null", False, "amount"),
    ]
    (snapshot,) = event["outputs"]
    assert (snapshot["namespace"], snapshot["name"]) == (
        "file",
        f"{tmp_path}/{config.data.uri}/_trainpipe/snapshots/{manifest.digest.removeprefix('sha256:')}.json",
    )
    facets = facets_of(snapshot)
    assert facets["trainpipe_snapshot"]["digest"] == facets["version"]["datasetVersion"] == manifest.digest
    assert facets["trainpipe_snapshot"]["window"] == ["ds=2026-01-01", "ds=2026-01-02"]
    assert facets["outputStatistics"] == {
        **facets["outputStatistics"],
        "rowCount": 100,
        "fileCount": 2,
        "size": 20,
    }


def test_a_snapshot_frozen_or_joined_elsewhere_still_names_the_partition_it_was_read_from(
    config: Any, tmp_path: Path
) -> None:
    # data.freeze, or a feature-store join: the files lie in the snapshot store, not the partition.
    manifest = _manifest(
        tmp_path / "store", partition_uri=(tmp_path / config.data.uri / "ds=2026-01-02").as_uri()
    )
    event = _event(lineage.validation(config, manifest, []))
    assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [
        ("file", str(tmp_path / config.data.uri / "ds=2026-01-02"))
    ]


def test_nothing_is_reported_before_a_snapshot_exists(config: Any) -> None:
    empty = lineage.validation(config, None, [])
    assert (empty.inputs, empty.outputs) == ([], [])


def test_a_delta_source_is_named_by_its_location_at_the_version_read(config: Any, tmp_path: Path) -> None:
    table = (tmp_path / "lake" / "transactions").as_uri()
    source = SourceLineage(kind="delta", table=table, version=7, window_start="a", window_end="b")
    manifest = _manifest(tmp_path / "store", source=source)
    config = parse_config((EXAMPLE_CONFIGS / "fraud_detector_delta.yaml").read_text())
    event = _event(lineage.validation(config, manifest, []))
    assert schema_errors(event) == []
    (read,) = event["inputs"]
    assert (read["namespace"], read["name"]) == ("file", str(tmp_path / "lake" / "transactions"))
    assert read["facets"]["version"]["datasetVersion"] == "7"
    assert facets_of(event["outputs"][0])["trainpipe_snapshot"]["origin"] == f"{table} at version 7"


def test_gate_reports_its_decision_and_what_it_compared(config: Any) -> None:
    decision = GateDecision(
        promote=False,
        reason="roc_auc improved by 0.001 < 0.002",
        metric="roc_auc",
        direction="maximize",
        candidate=0.901,
        champion=0.9,
        improvement=0.001,
        guardrails=[
            GuardrailCheck(
                metric="log_loss",
                direction="minimize",
                candidate=0.3,
                champion=0.2,
                regression=0.1,
                relative_regression=0.5,
                max_regression=0.02,
                max_relative_regression=None,
                passed=False,
            )
        ],
        mlflow_run_id="abc123",
        champion_version="4",
    )
    event = _event(lineage.gate(config, decision, "http://alice:secret@127.0.0.1:5000"))
    assert schema_errors(event) == []
    assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [
        ("http://127.0.0.1:5000", "runs/abc123/model"),
        ("http://127.0.0.1:5000", "models/fraud_detector/versions/4"),
    ]
    gate = event["run"]["facets"]["trainpipe_gate"]
    assert (gate["promote"], gate["championVersion"], gate["failedGuardrails"]) == (False, "4", ["log_loss"])
    assert "secret" not in str(event)


def test_register_outputs_the_version_with_its_alias_and_links_back_to_the_snapshot(config: Any) -> None:
    digest = combine(SHAS)
    registered = {
        "model_name": "fraud_detector",
        "version": "5",
        "model_uri": "models:/fraud_detector/5",
        "mlflow_run_id": "abc123",
        "data_digest": digest,
        "alias": "champion",
        "promoted": True,
        "previous_version": "4",
    }
    event = _event(lineage.registration(config, registered, "sqlite:////srv/mlflow.db"))
    assert schema_errors(event) == []
    model_run, snapshot = event["inputs"]
    assert (model_run["namespace"], model_run["name"]) == ("sqlite:////srv/mlflow.db", "runs/abc123/model")
    assert snapshot["namespace"] == "file"
    assert snapshot["name"].endswith(f"/_trainpipe/snapshots/{digest.removeprefix('sha256:')}.json")
    (version,) = event["outputs"]
    assert (version["namespace"], version["name"]) == (
        "sqlite:////srv/mlflow.db",
        "models/fraud_detector/versions/5",
    )
    model = version["facets"]["trainpipe_model"]
    assert (model["alias"], model["promoted"], model["previousVersion"], model["dataDigest"]) == (
        "champion",
        True,
        "4",
        digest,
    )


def test_a_schema_error_is_seen(config: Any, tmp_path: Path) -> None:
    # Guards the guard: a facet that breaks its schema is reported, so the checks above can fail.
    event = _event(lineage.validation(config, _manifest(tmp_path), []))
    event["outputs"][0]["facets"]["trainpipe_snapshot"]["rows"] = "many"
    assert any("trainpipe_snapshot" in error for error in schema_errors(event))


def test_a_sql_source_names_each_table_its_query_read(
    config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_WAREHOUSE", json.dumps({"conn_type": "sqlite", "host": str(tmp_path / "w.db")})
    )
    query = (
        "SELECT t.amount, m.risk FROM card_transactions t JOIN merchants m ON t.merchant = m.id "
        "WHERE t.event_time >= '2026-01-01' AND t.event_time < '2026-01-02'"
    )
    source = SourceLineage(kind="sql", conn_id="warehouse", query=query, window_start="a", window_end="b")
    config = parse_config((EXAMPLE_CONFIGS / "fraud_detector_sql.yaml").read_text())
    event = _event(lineage.validation(config, _manifest(tmp_path / "store", source=source), []))
    assert schema_errors(event) == []
    assert sorted((d["namespace"], d["name"]) for d in event["inputs"]) == [
        (f"sqlite://{tmp_path / 'w.db'}", "card_transactions"),
        (f"sqlite://{tmp_path / 'w.db'}", "merchants"),
    ]


def _fine_tuned(source: str) -> Any:
    from airflow_trainpipe.contracts.payloads import TrainResult

    return TrainResult.model_validate(
        {
            "final_step": 4, "final_train_loss": 0.5, "holdout_metrics": {"roc_auc": 0.9}, "weights_sha256": "c" * 64,
            "resumed_from_step": 0, "steps_recomputed": 0, "epochs_completed": 1, "stopped_early": False,
            "world_size": 2, "timing": {"steps": 4, "loop_s": 1.0, "train_s": 1.0, "checkpoint_s": 0.0, "eval_s": 0.0,
            "data_wait_s": 0.0}, "mlflow_run_id": "r1", "mlflow_experiment_id": "1", "transform_hash": "t",
            "evaluation": None, "model_uri": "models:/m-1",
            "pretrained": {"uri": "models:/router@champion", "source": source, "sha256": "d" * 64},
        }
    )  # fmt: skip


@pytest.mark.parametrize(
    ("source", "namespace", "name"),
    [
        ("models:/router/7", "http://127.0.0.1:5000", "models/router/versions/7"),
        ("s3://models/encoders/base", "s3://models", "encoders/base"),
        ("file:///models/encoder", "file", "/models/encoder"),
    ],
)
def test_a_fine_tune_reads_its_pretrained_source_at_the_pinned_sha256(
    config: Any, tmp_path: Path, source: str, namespace: str, name: str
) -> None:
    operator_lineage = lineage.training(
        config, _manifest(tmp_path), _fine_tuned(source), "http://127.0.0.1:5000"
    )
    event = _event(operator_lineage)
    assert schema_errors(event) == []
    pretrained = [d for d in event["inputs"] if d["name"] == name]
    assert len(pretrained) == 1 and pretrained[0]["namespace"] == namespace
    assert pretrained[0]["facets"]["version"]["datasetVersion"] == "d" * 64
    assert len(event["inputs"]) == 2  # and the snapshot
