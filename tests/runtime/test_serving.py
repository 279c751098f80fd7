"""The logged model takes raw rows: a real 2-rank job, its pyfunc loaded by alias from the registry.
A classifier names its class: `predicted_label` beside the probabilities, at the version's own
threshold (binary) or the top class (multiclass), on in-memory predictors of fitted transforms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from mlflow.tracking import MlflowClient
from mlflow.types import DataType
from mlflow.types.schema import AnyType

from airflow_trainpipe.contracts.predictions import PREDICTED_LABEL, PROBABILITY
from airflow_trainpipe.runtime.data.reader import HoldoutSplit, read_table
from airflow_trainpipe.runtime.data.transform import FittedTransform
from tests.helpers.jobs import job_config, uninterrupted_run
from tests.helpers.transforms import small_classifier, tickets_transform

slow = pytest.mark.slow  # the tests of the trained job's model; the in-memory ones are fast

MODEL_NAME = "fraud_serving_test"


@pytest.fixture(scope="module")
def job(
    tmp_path_factory: pytest.TempPathFactory, trainpipe_home: Path, job_files: list[str]
) -> dict[str, Any]:
    run = uninterrupted_run(tmp_path_factory, job_files)  # shared with the resume tests
    mlflow.set_tracking_uri(f"sqlite:///{trainpipe_home / 'mlflow.db'}")
    client = MlflowClient()
    version = mlflow.register_model(run.result["model_uri"], MODEL_NAME).version
    client.set_registered_model_alias(MODEL_NAME, "champion", version)
    data = job_config(tmp_path_factory.mktemp("unused")).data
    table = read_table(
        job_files, data.format, list(dict.fromkeys([*data.features.all, data.label, data.holdout.key_column]))
    )
    holdout = table.filter(pa.array(HoldoutSplit(data).mask(table)))
    return {"result": run.result, "client": client, "holdout": holdout, "features": data.features.all}


def _consumer(code: str, env_home: Path) -> dict[str, Any]:
    """A fresh interpreter that only imports mlflow and pandas, as a model consumer would."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{env_home / 'mlflow.db'}"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True, timeout=300
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@slow
def test_pyfunc_on_raw_rows_reproduces_the_jobs_own_predictions(
    job: dict[str, Any], trainpipe_home: Path, tmp_path: Path
) -> None:
    run_id = job["result"]["mlflow_run_id"]
    logged = mlflow.artifacts.load_dict(f"runs:/{run_id}/holdout_predictions.json")
    rows = job["holdout"].select(job["features"]).slice(0, logged["rows"]).to_pandas()
    rows.to_parquet(tmp_path / "raw.parquet")
    reply = _consumer(
        "import json, sys, mlflow, pandas as pd\n"
        f"model = mlflow.pyfunc.load_model('models:/{MODEL_NAME}@champion')\n"
        f"predictions = model.predict(pd.read_parquet({str(tmp_path / 'raw.parquet')!r}))\n"
        f"print(json.dumps({{'predictions': predictions[{PROBABILITY!r}].tolist(),"
        " 'training_code': sorted(m for m in sys.modules if m.startswith(('deepspeed', 'airflow_trainpipe.runtime.train')))}))",
        trainpipe_home,
    )
    assert reply["training_code"] == []  # the consumer never loads the training job or DeepSpeed
    served, trained = np.array(reply["predictions"]), np.array(logged["predictions"])
    assert len(served) == len(trained) == min(1000, job["holdout"].num_rows) > 100
    np.testing.assert_allclose(served, trained, rtol=1e-6, atol=1e-7)


@slow
def test_the_model_carries_its_transform_hash_signature_and_raw_example(job: dict[str, Any]) -> None:
    result, client = job["result"], job["client"]
    run = client.get_run(result["mlflow_run_id"])
    assert run.data.tags["trainpipe.transform_hash"] == result["transform_hash"]
    local = Path(mlflow.artifacts.download_artifacts(result["model_uri"]))
    shipped = FittedTransform.from_json(next(local.rglob("transform.json")).read_text())
    assert shipped.hash == result["transform_hash"]
    info = mlflow.models.get_model_info(result["model_uri"])
    inputs = {spec.name: spec for spec in info.signature.inputs.inputs}
    assert list(inputs) == job["features"]
    assert inputs["distance_from_home_km"].required is False and inputs["amount"].required is True
    assert inputs["channel"].type == DataType.string and isinstance(inputs["amount"].type, AnyType)
    example = json.loads((local / "input_example.json").read_text())
    assert example["columns"] == job["features"]  # raw rows, not encoded model inputs


@pytest.fixture(scope="module")
def model(job: dict[str, Any]) -> Any:
    return mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}@champion")


def _rows(job: dict[str, Any], n: int = 20) -> pd.DataFrame:
    return job["holdout"].select(job["features"]).slice(0, n).to_pandas()


@slow
def test_unseen_categories_and_nans_are_scored_as_declared(job: dict[str, Any], model: Any) -> None:
    rows = _rows(job)
    rows["country"] = "XX-never-seen"
    rows["channel"] = ["carrier-pigeon", None] * 10
    rows["amount"] = np.nan
    rows["distance_from_home_km"] = [np.nan, 3.0] * 10
    predictions = model.predict(rows)[PROBABILITY].to_numpy()
    assert predictions.shape == (20,) and np.all((predictions > 0) & (predictions < 1))


@slow
def test_a_missing_optional_column_means_all_missing(job: dict[str, Any], model: Any) -> None:
    rows = _rows(job)
    without = model.predict(rows.drop(columns=["distance_from_home_km"]))[PROBABILITY].to_numpy()
    all_nan = model.predict(rows.assign(distance_from_home_km=np.nan))[PROBABILITY].to_numpy()
    np.testing.assert_array_equal(without, all_nan)
    assert not np.allclose(without, model.predict(rows)[PROBABILITY].to_numpy())  # the column does matter


@slow
def test_a_missing_required_column_is_named(job: dict[str, Any], model: Any) -> None:
    with pytest.raises(Exception, match="amount"):
        model.predict(_rows(job).drop(columns=["amount"]))


@slow
def test_the_binary_model_names_its_class_at_the_threshold_its_run_tagged(
    job: dict[str, Any], model: Any
) -> None:
    """`probability` (P(class 1)) and `predicted_label` 1 at or above the threshold the final
    evaluation chose (max_f1, not 0.5): the number in the model's config is the run's tag, which the
    register task copies onto the version."""
    result = job["result"]
    tag = job["client"].get_run(result["mlflow_run_id"]).data.tags["trainpipe.threshold"]
    threshold = float(tag)
    assert threshold != 0.5
    info = mlflow.models.get_model_info(result["model_uri"])
    assert info.flavors["python_function"]["config"] == {"threshold": threshold}
    outputs = [(spec.name, spec.type) for spec in info.signature.outputs.inputs]
    assert outputs == [(PROBABILITY, DataType.double), (PREDICTED_LABEL, DataType.long)]
    answer = model.predict(_rows(job, 400))
    assert list(answer.columns) == [PROBABILITY, PREDICTED_LABEL]
    assert answer[PREDICTED_LABEL].dtype == np.int64
    expected = (answer[PROBABILITY] >= threshold).astype(np.int64)
    np.testing.assert_array_equal(answer[PREDICTED_LABEL], expected)
    assert (answer[PREDICTED_LABEL] != (answer[PROBABILITY] >= 0.5)).any()  # the threshold decides


def test_a_multiclass_answer_names_the_top_class_beside_unchanged_probability_columns(
    tmp_path: Path,
) -> None:
    from airflow_trainpipe.runtime.serving import TransformedNetwork, signature

    transform, table = tickets_transform(tmp_path)
    classes = transform.classes
    assert classes is not None
    rows = table.slice(0, 200).drop_columns(["team"]).to_pandas()
    predictor = TransformedNetwork.of(transform, small_classifier(transform))
    answer = predictor.predict(None, rows)
    assert list(answer.columns) == [*classes, PREDICTED_LABEL]
    probabilities = predictor.scores(rows)  # what the job scores by
    pd.testing.assert_frame_equal(answer[classes], probabilities)  # what clients read keeps working
    top = [classes[i] for i in probabilities.to_numpy().argmax(axis=1)]
    assert answer[PREDICTED_LABEL].tolist() == top
    outputs = [(spec.name, spec.type) for spec in signature(transform).outputs.inputs]
    assert outputs == [*((c, DataType.double) for c in classes), (PREDICTED_LABEL, DataType.string)]


def test_a_class_named_like_the_label_column_is_refused_before_anything_is_logged(tmp_path: Path) -> None:
    from airflow_trainpipe.runtime.serving import TransformedNetwork, log_raw_row_model, signature

    transform, _ = tickets_transform(tmp_path)
    network = small_classifier(transform)
    document = json.loads(transform.to_json())
    document["label"]["classes"][1] = PREDICTED_LABEL
    clashing = FittedTransform(document)
    for refused in (
        lambda: signature(clashing),
        lambda: TransformedNetwork.of(clashing, network),
        lambda: log_raw_row_model(network, clashing, input_example=None),  # no MLflow run needed
    ):
        with pytest.raises(ValueError, match=r"a class named 'predicted_label'.*rename that class"):
            refused()


def test_the_binary_label_is_1_at_or_above_the_threshold_and_others_keep_their_scores() -> None:
    from airflow_trainpipe.runtime.serving import labelled

    def transform(task: str) -> Any:
        return SimpleNamespace(task=task, classes=None)

    scores = np.array([0.1, 0.3, 0.2999999, 0.9])
    answer = labelled(scores, transform("binary_classification"), 0.3)
    assert answer[PREDICTED_LABEL].tolist() == [0, 1, 0, 1]
    np.testing.assert_array_equal(answer[PROBABILITY], scores)
    # A binary model logged before the label column (no threshold in its config) answers as it did.
    assert labelled(scores, transform("binary_classification"), None) is scores
    for task in ("regression", "ranking"):
        assert labelled(scores, transform(task), 0.3) is scores
