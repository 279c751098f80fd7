"""The final evaluation's champion scoring against a real (embedded) MLflow registry."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import mlflow
import numpy as np
import pyarrow as pa
import pytest
import torch

from airflow_trainpipe.config import load_config
from airflow_trainpipe.runtime.data import TabularEncoder
from airflow_trainpipe.runtime.evaluation import score, score_champion
from airflow_trainpipe.runtime.tracking import artifact_location
from tests.operators.mlflow_backends import write_config


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from mlflow.tracking._tracking_service import utils

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(utils, "_tracking_uri", uri)
    return mlflow.MlflowClient(uri)


def _holdout() -> pa.Table:
    rng = np.random.default_rng(0)
    amount = rng.gamma(2.0, 50.0, 300)
    return pa.table({"amount": amount, "channel": rng.choice(["web", "pos", "atm"], 300),
                     "is_fraud": (amount + rng.normal(0, 30, 300) > 150).astype(np.int64)})


def _champion(client, name: str, encoder: TabularEncoder) -> torch.nn.Module:
    """Register a small model with its encoder.json the way the training job logs them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 1))
    experiment = client.create_experiment("e", artifact_location=artifact_location(mlflow.get_tracking_uri(), "e"))
    with mlflow.start_run(experiment_id=experiment) as run:
        mlflow.log_dict(json.loads(encoder.to_json()), "encoder.json")
        info = mlflow.pytorch.log_model(model, name="model", input_example=np.zeros((2, 2), np.float32),
                                        export_model=False, pip_requirements=["torch"])
    client.create_registered_model(name)
    version = client.create_model_version(name, info.model_uri, run_id=run.info.run_id, model_id=info.model_id)
    client.set_registered_model_alias(name, "champion", version.version)
    return model


def test_champion_is_scored_by_the_same_function_on_the_given_rows(registry, tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path / "p.yaml", "champ"))
    holdout = _holdout()
    encoder = TabularEncoder(["amount"], ["channel"], [100.0], [50.0], [["atm", "pos", "web"]])
    model = _champion(registry, "champ", encoder)
    result = score_champion(registry, config, holdout)
    assert (result.version, result.error) == ("1", None)
    assert result.metrics == score(model, encoder, holdout, "is_fraud", "binary_classification")
    assert result.tags()["trainpipe.champion.version"] == "1" and result.tags()["trainpipe.champion.run_id"] == result.run_id


def test_no_champion_is_a_bootstrap(registry, tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path / "p.yaml", "nobody"))
    result = score_champion(registry, config, _holdout())
    assert result.version is None and result.metrics is None
    assert result.tags()["trainpipe.champion.version"] == "none"


def test_a_champion_needing_columns_the_data_lacks_is_recorded_not_raised(registry, tmp_path: Path, caplog) -> None:
    config = load_config(write_config(tmp_path / "p.yaml", "oldfeatures"))
    encoder = TabularEncoder(["amount", "zip_risk"], [], [100.0, 0.0], [50.0, 1.0], [])
    _champion(registry, "oldfeatures", encoder)
    with caplog.at_level(logging.ERROR):
        result = score_champion(registry, config, _holdout())
    assert result.metrics is None
    assert result.error == (f"cannot score champion oldfeatures version 1 (run {result.run_id}): ValueError: it needs "
                            "column(s) zip_risk that this run's data config does not read")
    assert result.tags()["trainpipe.champion.error"] == result.error
