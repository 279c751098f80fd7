"""Both MLflow backends the operators must work with, as Airflow connections, plus test configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_trainpipe.contracts.payloads import GateDecision
from tests.conftest import EXAMPLE_CONFIGS, fresh_mlflow_store

BACKENDS = ["server", "sqlite"]


def define_connection(
    monkeypatch: pytest.MonkeyPatch, backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> str:
    """Set AIRFLOW_CONN_MLFLOW_DEFAULT for `backend`; returns its JSON (for subprocesses)."""
    if backend == "server":
        value = request.getfixturevalue("mlflow_server").connection_json()
    else:
        store = fresh_mlflow_store(tmp_path / "embedded", request.getfixturevalue("migrated_mlflow_db"))
        value = json.dumps({"conn_type": "mlflow", "extra": {"tracking_uri": store}})
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", value)
    return value


def write_config(path: Path, model_name: str, replacements: tuple[tuple[str, str], ...] = ()) -> Path:
    """fraud_detector.yaml registering into `model_name`, bootstrap without min_value."""
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    for old, new in (
        ("model_name: fraud_detector", f"model_name: {model_name}"),
        ("min_value: 0.7", "min_value: 0.5"),
        *replacements,
    ):
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


def gate_decision(**fields: object) -> GateDecision:
    """A gate decision as the gate task writes it; only what a test is about needs saying."""
    defaults = {
        "promote": True,
        "reason": "test",
        "metric": "roc_auc",
        "direction": "maximize",
        "candidate": 0.8,
        "champion": None,
    }
    return GateDecision.model_validate({**defaults, **fields})
