"""The final evaluation's champion scoring against a real (embedded) MLflow registry."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import mlflow
import numpy as np
import pyarrow as pa
import pytest
import torch

from airflow_trainpipe.config import load_config
from airflow_trainpipe.core.tracking_store import artifact_location
from airflow_trainpipe.runtime.data.transform import FORMAT, FittedTransform
from airflow_trainpipe.runtime.evaluation.final import (
    _improvement_interval,
    candidate_predictor,
    predictions,
    score,
    score_champion,
)
from airflow_trainpipe.runtime.evaluation.metrics import compute_metrics
from airflow_trainpipe.runtime.serving import SERVED_MODEL_CODE, log_raw_row_model
from tests.conftest import fresh_mlflow_store
from tests.helpers.mlflow_backends import write_config


def _transform(numeric: list[str], categories: list[str] | None) -> FittedTransform:
    """A fitted transform document like the job writes: standardised numerics, a vocabulary index."""
    columns = [
        {
            "name": n,
            "kind": "numeric",
            "log1p": False,
            "clip": None,
            "fill": 100.0,
            "center": 100.0,
            "scale": 50.0,
            "missing_indicator": False,
            "optional": False,
        }
        for n in numeric
    ]
    if categories is not None:
        columns.append(
            {
                "name": "channel",
                "kind": "categorical",
                "encode": "index",
                "categories": categories,
                "missing": "unknown",
                "missing_indicator": False,
                "optional": False,
                "source_type": "string",
            }
        )
    return FittedTransform(
        {
            "format": FORMAT,
            "columns": columns,
            "label": {"name": "is_fraud", "task": "binary_classification", "mean": 0.0, "std": 1.0},
        }
    )


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_mlflow_db: Path):
    from mlflow.tracking._tracking_service import utils

    uri = fresh_mlflow_store(tmp_path, migrated_mlflow_db)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(utils, "_tracking_uri", uri)
    return mlflow.MlflowClient(uri)


def _holdout() -> pa.Table:
    rng = np.random.default_rng(0)
    amount = rng.gamma(2.0, 50.0, 300)
    return pa.table(
        {
            "amount": amount,
            "channel": rng.choice(["web", "pos", "atm"], 300),
            "is_fraud": (amount + rng.normal(0, 30, 300) > 150).astype(np.int64),
        }
    )


def _champion(client, name: str, transform: FittedTransform) -> torch.nn.Module:
    """Register a small model the way the training job logs it: a pyfunc on raw rows."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(transform.width, 1))
    experiment = client.create_experiment(
        "e", artifact_location=artifact_location(mlflow.get_tracking_uri(), "e")
    )
    with mlflow.start_run(experiment_id=experiment) as run:
        info = log_raw_row_model(model, transform, input_example=None)
    client.create_registered_model(name)
    version = client.create_model_version(
        name, info.model_uri, run_id=run.info.run_id, model_id=info.model_id
    )
    client.set_registered_model_alias(name, "champion", version.version)
    return model


def test_champion_is_scored_by_the_same_function_on_the_given_rows(registry, tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path / "p.yaml", "champ"))
    holdout = _holdout()
    transform = _transform(["amount"], ["atm", "pos", "web"])
    model = _champion(registry, "champ", transform)
    result = score_champion(registry, config, holdout)
    assert (result.version, result.error) == ("1", None)
    # The champion's pyfunc (its own transform, torch.export network) and the in-memory
    # candidate path give the same metrics on the same rows.
    assert result.metrics == score(
        candidate_predictor(model, transform),
        holdout,
        "is_fraud",
        "binary_classification",
        config.evaluation.threshold,
    )
    assert (
        result.tags()["trainpipe.champion.version"] == "1"
        and result.tags()["trainpipe.champion.run_id"] == result.run_id
    )


def test_a_champion_that_cannot_score_on_the_training_device_is_scored_on_the_cpu(
    registry, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The end scores the champion on the job's device (a GPU); where torch cannot move its program
    # there or run it, the CPU scores it: the gate still gets the champion's metrics, never an error.
    # "meta" stands in for such a device on a CPU machine: the program moves, its outputs hold no data.
    config = load_config(write_config(tmp_path / "p.yaml", "moved"))
    holdout = _holdout()
    transform = _transform(["amount"], ["atm", "pos", "web"])
    _champion(registry, "moved", transform)
    with caplog.at_level(logging.WARNING):
        result = score_champion(registry, config, holdout, device=torch.device("meta"))
    assert (result.version, result.error) == ("1", None)
    assert result.metrics == score_champion(registry, config, holdout).metrics
    assert "did not score on meta" in caplog.text


def test_the_candidate_scored_on_a_device_puts_its_rows_there_and_its_outputs_back() -> None:
    transform = _transform(["amount"], ["atm", "pos", "web"])
    model = torch.nn.Sequential(torch.nn.Linear(transform.width, 1))
    rows = _holdout().drop_columns(["is_fraud"]).to_pandas()
    on_cpu = candidate_predictor(model, transform)(rows)
    assert np.array_equal(candidate_predictor(model, transform, torch.device("cpu"))(rows), on_cpu)


def test_with_confidence_the_champion_itself_as_candidate_is_a_tie_not_an_improvement(
    registry, tmp_path: Path
) -> None:
    config = load_config(
        write_config(
            tmp_path / "p.yaml",
            "tie",
            (
                (
                    "min_improvement: 0.001",
                    "min_improvement: 0.001\n  confidence: 0.95\n  bootstrap_samples: 200",
                ),
            ),
        )
    )
    holdout = _holdout()
    transform = _transform(["amount"], ["atm", "pos", "web"])
    model = _champion(registry, "tie", transform)
    champion = score_champion(registry, config, holdout)
    assert champion.predictions is not None and len(champion.predictions) == holdout.num_rows
    prediction, labels = predictions(candidate_predictor(model, transform), holdout, "is_fraud")
    candidate = compute_metrics(
        "binary_classification", labels, prediction, threshold=config.evaluation.threshold
    )
    # The same model on the same rows: every resample scores both alike.
    ours = (prediction, candidate["threshold"])
    assert _improvement_interval(config, labels, ours, champion.scored()) == (0.0, 0.0)
    from airflow_trainpipe.registry.promotion import decide

    decision = decide(config.gate, "binary_classification", candidate, champion.metrics, interval=(0.0, 0.0))
    assert decision.promote is False


def test_no_champion_is_a_bootstrap(registry, tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path / "p.yaml", "nobody"))
    result = score_champion(registry, config, _holdout())
    assert result.version is None and result.metrics is None
    assert result.tags()["trainpipe.champion.version"] == "none"


def test_a_champion_needing_columns_the_data_lacks_is_recorded_not_raised(
    registry, tmp_path: Path, caplog
) -> None:
    config = load_config(write_config(tmp_path / "p.yaml", "oldfeatures"))
    _champion(registry, "oldfeatures", _transform(["amount", "zip_risk"], None))
    with caplog.at_level(logging.ERROR):
        result = score_champion(registry, config, _holdout())
    assert result.metrics is None
    assert result.error == (
        f"cannot score champion oldfeatures version 1 (run {result.run_id}): ValueError: it needs "
        "column(s) zip_risk that this run's data config does not read"
    )
    assert result.tags()["trainpipe.champion.error"] == result.error


def test_a_champion_logged_before_raw_row_models_is_recorded_not_raised(registry, tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path / "p.yaml", "legacy"))
    experiment = registry.create_experiment(
        "e", artifact_location=artifact_location(mlflow.get_tracking_uri(), "e")
    )
    with mlflow.start_run(experiment_id=experiment) as run:
        info = mlflow.pytorch.log_model(
            torch.nn.Linear(2, 1),
            name="model",
            input_example=np.zeros((2, 2), np.float32),
            export_model=False,
            pip_requirements=["torch"],
        )
    registry.create_registered_model("legacy")
    version = registry.create_model_version(
        "legacy", info.model_uri, run_id=run.info.run_id, model_id=info.model_id
    )
    registry.set_registered_model_alias("legacy", "champion", version.version)
    result = score_champion(registry, config, _holdout())
    assert result.metrics is None and "takes encoded tensors, not raw rows" in result.error


def test_the_champion_is_scored_from_its_artifacts_never_by_running_its_logged_code(
    registry, tmp_path: Path
) -> None:
    """Someone who can write the artifact store swaps the code MLflow runs to load the pyfunc (a
    copy of runtime/served_model.py) for their own: scoring the champion must neither run it nor
    need it."""
    config = load_config(write_config(tmp_path / "p.yaml", "tampered"))
    holdout = _holdout()
    transform = _transform(["amount"], ["atm", "pos", "web"])
    model = _champion(registry, "tampered", transform)
    proof = tmp_path / "ran"
    (code,) = (tmp_path / "mlartifacts").rglob("served_model.py")
    code.write_text(f"import pathlib\npathlib.Path({str(proof)!r}).touch()\n")
    result = score_champion(registry, config, holdout)
    assert result.error is None and not proof.exists()
    assert result.metrics == score(
        candidate_predictor(model, transform),
        holdout,
        "is_fraud",
        "binary_classification",
        config.evaluation.threshold,
    )
    with contextlib.suppress(Exception):  # it fails after the payload: the file sets no model
        mlflow.pyfunc.load_model("models:/tampered/1")
    assert proof.exists()  # what the check would have caught: loading the pyfunc runs the file


def test_a_model_is_logged_as_code_with_no_pickle_in_its_artifacts(registry, tmp_path: Path) -> None:
    # MLflow warned at every registration that a pyfunc object is pickled, and loading a pickle runs
    # whatever the artifact store holds.
    _champion(registry, "as_code", _transform(["amount"], ["atm", "pos", "web"]))
    artifacts = tmp_path / "mlartifacts"
    assert not list(artifacts.rglob("*.pkl"))
    (code,) = artifacts.rglob("served_model.py")
    assert code.read_text() == SERVED_MODEL_CODE.read_text()


def test_a_champion_s_class_probabilities_are_matched_to_the_candidate_s_classes_by_name() -> None:
    import pandas as pd

    rows = pa.table({"x": [1.0, 2.0, 3.0], "team": ["billing", "legal", "account"]})

    def champion(frame: pd.DataFrame) -> pd.DataFrame:
        # Trained before `shipping` existed, with its classes in another order.
        return pd.DataFrame({"billing": [0.7, 0.2, 0.1], "account": [0.3, 0.8, 0.9]})

    predicted, labels = predictions(champion, rows, "team", classes=["account", "billing", "shipping"])
    np.testing.assert_allclose(predicted, [[0.3, 0.7, 0.0], [0.8, 0.2, 0.0], [0.9, 0.1, 0.0]])
    assert labels.tolist() == [1.0, -1.0, 0.0]  # `legal` is no class of the candidate's
