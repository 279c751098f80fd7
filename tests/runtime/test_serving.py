"""The logged model takes raw rows: a real 2-rank job, its pyfunc loaded by alias from the registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from mlflow.tracking import MlflowClient
from mlflow.types import DataType
from mlflow.types.schema import AnyType

from airflow_trainpipe.runtime.data.reader import HoldoutSplit, read_table
from airflow_trainpipe.runtime.data.transform import FittedTransform
from tests.helpers.jobs import job_config, uninterrupted_run

pytestmark = pytest.mark.slow

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
        "print(json.dumps({'predictions': [float(p) for p in predictions],"
        " 'training_code': sorted(m for m in sys.modules if m.startswith(('deepspeed', 'airflow_trainpipe.runtime.train')))}))",
        trainpipe_home,
    )
    assert reply["training_code"] == []  # the consumer never loads the training job or DeepSpeed
    served, trained = np.array(reply["predictions"]), np.array(logged["predictions"])
    assert len(served) == len(trained) == min(1000, job["holdout"].num_rows) > 100
    np.testing.assert_allclose(served, trained, rtol=1e-6, atol=1e-7)


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


def test_unseen_categories_and_nans_are_scored_as_declared(job: dict[str, Any], model: Any) -> None:
    rows = _rows(job)
    rows["country"] = "XX-never-seen"
    rows["channel"] = ["carrier-pigeon", None] * 10
    rows["amount"] = np.nan
    rows["distance_from_home_km"] = [np.nan, 3.0] * 10
    predictions = np.asarray(model.predict(rows))
    assert predictions.shape == (20,) and np.all((predictions > 0) & (predictions < 1))


def test_a_missing_optional_column_means_all_missing(job: dict[str, Any], model: Any) -> None:
    rows = _rows(job)
    without = np.asarray(model.predict(rows.drop(columns=["distance_from_home_km"])))
    all_nan = np.asarray(model.predict(rows.assign(distance_from_home_km=np.nan)))
    np.testing.assert_array_equal(without, all_nan)
    assert not np.allclose(without, np.asarray(model.predict(rows)))  # the column does matter


def test_a_missing_required_column_is_named(job: dict[str, Any], model: Any) -> None:
    with pytest.raises(Exception, match="amount"):
        model.predict(_rows(job).drop(columns=["amount"]))
