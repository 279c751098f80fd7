"""Small real MLflow models for the canary: one numeric column `x`, a binary score per row.

Logged as models from code (the file goes into the model's artifacts), so `mlflow models serve`
loads them without this test tree on its path. `mode` is the model's config:
`good` (sigmoid of x), `flip` (1 - that: a champion and this disagree on every row), `flaky`
(fails every request holding a row whose `id` is a multiple of 5: a fifth of one-row requests).
Also a day's rows as a canary's callers send them (`day_rows`).
"""

from __future__ import annotations

import json
from pathlib import Path

MODEL_CODE = """
import math

import mlflow
from mlflow.pyfunc import PythonModel


class Scorer(PythonModel):
    def load_context(self, context):
        self.mode = (context.model_config or {}).get("mode", "good")

    def predict(self, context, model_input, params=None):
        if self.mode == "flaky" and (model_input["id"].astype(int) % 5 == 0).any():
            raise RuntimeError("flaky model: this row cannot be scored")
        score = 1 / (1 + (-model_input["x"].astype(float)).map(math.exp))
        return ((1 - score) if self.mode == "flip" else score).to_numpy()


mlflow.models.set_model(Scorer())
"""


def log_scorer(folder: Path, mode: str) -> str:
    """Log one model to the active tracking URI; returns its `models:/<id>` URI."""
    import mlflow
    import pandas as pd

    code = folder / "scorer.py"
    code.write_text(MODEL_CODE)
    with mlflow.start_run(run_name=f"scorer-{mode}"):
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=str(code),
            model_config={"mode": mode},
            input_example=pd.DataFrame({"id": [1, 2], "x": [0.5, -1.0]}),
        )
    return str(info.model_uri)


def request_body(row_id: int, x: float) -> bytes:
    return json.dumps({"dataframe_split": {"columns": ["id", "x"], "data": [[row_id, x]]}}).encode()


def day_rows(home: Path, day: str) -> list[dict]:
    """The first 400 rows of fraud_detector's day `day` under TRAINPIPE_HOME `home`, as request records."""
    import pandas as pd

    from airflow_trainpipe.config import load_config
    from tests.conftest import EXAMPLE_CONFIGS

    columns = load_config(EXAMPLE_CONFIGS / "fraud_detector.yaml").data.features.all
    frame = pd.read_parquet(next((home / "data" / "card_transactions" / f"ds={day}").glob("*.parquet")))
    return json.loads(frame[columns].head(400).to_json(orient="records"))
