"""The logged MLflow model: raw rows in, predictions out (fitted transform, then the network).

`mlflow.pyfunc.load_model(uri).predict(raw_dataframe)` needs no training code: the model holds
the fitted transform JSON and the network as a torch.export program (no model class needed to
load it), and its pip requirements pin this package, whose `runtime.transform` applies the JSON
(the same code the training job used). A classifier names its class: binary answers a DataFrame
of `probability` (P(class 1)) and `predicted_label` (1 at or above the model's threshold, the
number its version's `trainpipe.threshold` tag holds, carried in the pyfunc's `model_config`, so
serving reads no registry); multiclass one probability column per class and `predicted_label`
(contracts/predictions.py). Ranking answers scores (higher ranks first within a query),
regression values in the label's units. The job's own scoring (candidate, champion) reads
`scores`: the probabilities alone, as before the label column.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pyarrow as pa
import torch
from mlflow.pyfunc import PythonModel

from airflow_trainpipe.contracts.predictions import (
    PREDICTED_LABEL,
    PROBABILITY,
    THRESHOLD_CONFIG,
    label_collision,
)
from airflow_trainpipe.runtime.data.transform import FittedTransform
from airflow_trainpipe.runtime.models.inputs import exporting

BATCH = 4096
SERVED_MODEL_CODE = Path(__file__).with_name("served_model.py")


def network_outputs(network: Any, features: np.ndarray, device: torch.device | None = None) -> np.ndarray:
    """(rows,) outputs of a one-output network, (rows, outputs) of a multi-output one; `device`:
    where the network's weights are (the training device when the job scores at its end)."""
    outputs = []
    with torch.no_grad():
        for start in range(0, len(features), BATCH):
            batch = network(torch.from_numpy(features[start : start + BATCH]).to(device)).float()
            outputs.append((batch[:, 0] if batch.shape[1] == 1 else batch).cpu())
    return torch.cat(outputs).numpy().astype(np.float64) if outputs else np.zeros(0)


def to_arrow(rows: Any) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, dict):
        rows = pd.DataFrame(rows)
    if not isinstance(rows, pd.DataFrame):
        raise TypeError(f"expected a pandas DataFrame of raw rows, got {type(rows).__name__}")
    return pa.Table.from_pandas(rows, preserve_index=False)


class TransformedNetwork(PythonModel):  # type: ignore[misc]  # mlflow is untyped here
    """Artifacts: `transform` (the fitted transform JSON) and `network` (torch.export .pt2).

    Served, it runs on the CPU. The training job's end scores a candidate and the champion with the
    same predictor on its own device (`device`), in fp32 as served: a holdout of a ~100M encoder
    took minutes on the host of a GPU node that scores it in seconds."""

    device: torch.device | None = None  # None: the CPU (a served model)
    threshold: float | None = None
    """A binary model's decision threshold (its `model_config`); None: a model logged before the
    label column, which answers P(class 1) alone, as it did."""

    @classmethod
    def of(
        cls,
        transform: FittedTransform,
        network: torch.nn.Module,
        device: torch.device | None = None,
        threshold: float | None = None,
    ) -> TransformedNetwork:
        """The same predictor in memory, before logging: a candidate scored through `scores`
        is scored exactly as its logged model will serve."""
        refuse_label_collision(transform)
        model = cls()
        model.transform, model.network, model.device = transform, network.eval().to(device), device
        model.threshold = threshold
        return model

    @classmethod
    def from_artifacts(
        cls,
        transform: str | Path,
        network: str | Path,
        device: torch.device | None = None,
        model_config: dict[str, Any] | None = None,
    ) -> TransformedNetwork:
        """The model from its two artifact files and its `model_config`, without unpickling anything
        (runtime/resume/safe_load.py)."""
        model = cls()
        model.device = device
        artifacts = {"transform": str(transform), "network": str(network)}
        model.load_context(SimpleNamespace(artifacts=artifacts, model_config=model_config))
        return model

    def load_context(self, context: Any) -> None:
        from airflow_trainpipe.runtime.resume.safe_load import load_exported_program

        self.transform = FittedTransform.from_json(Path(context.artifacts["transform"]).read_text())
        self.network = load_exported_program(context.artifacts["network"], self.device)
        threshold = (getattr(context, "model_config", None) or {}).get(THRESHOLD_CONFIG)
        self.threshold = None if threshold is None else float(threshold)

    def scores(self, model_input: Any) -> np.ndarray | pd.DataFrame:
        """What the network says of raw rows: P(class 1) (binary), a DataFrame of probabilities with
        a column per class (multiclass), scores (ranking), values (regression). What the job scores
        candidate and champion by; a served answer adds the predicted class (`predict`)."""
        features = self.transform.features(to_arrow(model_input))
        predicted = self.transform.predictions(network_outputs(self.network, features, self.device))
        if self.transform.classes:
            return pd.DataFrame(
                predicted.reshape(-1, len(self.transform.classes)), columns=self.transform.classes
            )
        return predicted

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> np.ndarray | pd.DataFrame:
        """The served answer: `scores`, and for a classifier the predicted class beside them."""
        return labelled(self.scores(model_input), self.transform, self.threshold)


def labelled(
    scores: np.ndarray | pd.DataFrame, transform: FittedTransform, threshold: float | None
) -> np.ndarray | pd.DataFrame:
    """A classifier's scores with `predicted_label` beside them (contracts/predictions.py): the
    class of highest probability (multiclass; the first on a tie), 1 at or above `threshold` else 0
    (binary, its probability column `probability`). Others' scores, and a binary model without a
    threshold (logged before the label column), are returned as they are."""
    if isinstance(scores, pd.DataFrame):  # multiclass: the probability columns keep their names
        refuse_label_collision(transform)
        names = np.asarray(transform.classes, dtype=object)
        return scores.assign(**{PREDICTED_LABEL: names[scores.to_numpy().argmax(axis=1)]})
    if transform.task != "binary_classification" or threshold is None:
        return scores
    return pd.DataFrame({PROBABILITY: scores, PREDICTED_LABEL: (scores >= threshold).astype(np.int64)})


def refuse_label_collision(transform: FittedTransform) -> None:
    problem = label_collision(transform.classes)
    if problem is not None:
        raise ValueError(f"cannot serve this model: {problem}")


def load_registered(
    model_uri: str, directory: str | Path, device: torch.device | None = None
) -> tuple[TransformedNetwork, Any]:
    """A logged model's predictor and input schema, read from its artifacts into `directory`, its
    network moved to `device` (None: the CPU).

    Only the MLmodel file (YAML), the transform (JSON) and the network program are downloaded
    and read: the pyfunc itself is never loaded (neither the code it was logged with nor an older
    version's pickled `python_model.pkl`), so a registry that others can write cannot make the
    scoring process run code.
    """
    from mlflow.models import Model
    from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository

    repository = ModelsArtifactRepository(model_uri)
    model = Model.load(repository.download_artifacts("MLmodel", dst_path=str(directory)))
    flavor = model.flavors.get("python_function") or {}
    artifacts = flavor.get("artifacts") or {}
    if not {"transform", "network"} <= set(artifacts):
        raise ValueError(
            f"its model takes encoded tensors, not raw rows ({model_uri} has no fitted transform and network "
            f"program among its artifacts: {sorted(artifacts) or 'none'}; logged before raw-row models)"
        )
    files = {
        name: repository.download_artifacts(artifacts[name]["path"], dst_path=str(directory))
        for name in ("transform", "network")  # not the Hugging Face copy: the program scores
    }
    predictor = TransformedNetwork.from_artifacts(
        files["transform"], files["network"], device, model_config=flavor.get("config")
    )
    return predictor, model.get_input_schema()


def log_raw_row_model(
    model: torch.nn.Module,
    transform: FittedTransform,
    input_example: Any,
    name: str = "model",
    hf_directory: Path | None = None,
    laps: Any = None,
    threshold: float | None = None,
) -> Any:
    """Log `model` behind `transform` as a pyfunc into the active MLflow run; returns the ModelInfo.
    `hf_directory`: the same model as a Hugging Face directory, the `hf` artifact (what
    `transformers` loads, and what `training.pretrained: models:/...` fine-tunes from).
    `threshold` (binary): where its predicted label turns 1, kept in its `model_config` (None: 0.5,
    what a version without a `trainpipe.threshold` tag is read as)."""
    import tempfile

    refuse_label_collision(transform)  # before the export: the model could not answer its classes
    config = None
    if transform.task == "binary_classification":
        config = {THRESHOLD_CONFIG: 0.5 if threshold is None else float(threshold)}

    with tempfile.TemporaryDirectory(prefix="trainpipe-model-") as tmp:
        transform_path, network_path = Path(tmp, "transform.json"), Path(tmp, "network.pt2")
        transform_path.write_text(transform.to_json())
        export_network(model, transform.width, network_path)
        if laps is not None:
            laps.lap("export")
        artifacts = {"transform": str(transform_path), "network": str(network_path)}
        if hf_directory is not None:
            artifacts["hf"] = str(hf_directory)
        info = mlflow.pyfunc.log_model(
            name=name,
            python_model=str(SERVED_MODEL_CODE),  # code, not a pickle (runtime/served_model.py)
            artifacts=artifacts,
            model_config=config,
            signature=signature(transform),
            input_example=input_example,
            pip_requirements=pip_requirements(text=bool(transform.text)),
        )
        if laps is not None:
            laps.lap("mlflow_log_model")
        return info


def export_network(model: torch.nn.Module, width: int, path: Path) -> None:
    """A program with a dynamic batch dimension: the consumer needs torch, not the model's class."""
    example = torch.zeros(2, width)
    with exporting():
        program = torch.export.export(
            model.eval(), (example,), dynamic_shapes=({0: torch.export.Dim("batch")},)
        )
    torch.export.save(program, str(path))


def signature(transform: FittedTransform) -> Any:
    """Raw input columns; optional ones are not required. Outputs: a classifier's probability
    column(s) and `predicted_label` (long 0/1 for binary, the class name for multiclass), one
    unnamed double for ranking and regression.

    Numeric columns accept any numeric dtype (MLflow would refuse an int64 column declared
    double, and an integer column declared long once a NaN makes pandas store it as float);
    the transform casts them and names a column that is not numeric. String categoricals are
    strings (None allowed), and so are text columns (the model tokenizes them itself).
    """
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema
    from mlflow.types.schema import AnyType

    inputs: list[Any] = [
        ColSpec(
            "string" if fitted.get("source_type") == "string" else AnyType(),
            fitted["name"],
            required=not fitted["optional"],
        )
        for fitted in transform.columns
    ]
    inputs += [ColSpec("string", column) for text in transform.text for column in text["columns"]]
    refuse_label_collision(transform)
    outputs: list[Any] = [ColSpec("double")]
    if transform.classes:
        outputs = [
            *(ColSpec("double", name) for name in transform.classes),
            ColSpec("string", PREDICTED_LABEL),
        ]
    elif transform.task == "binary_classification":
        outputs = [ColSpec("double", PROBABILITY), ColSpec("long", PREDICTED_LABEL)]
    return ModelSignature(inputs=Schema(inputs), outputs=Schema(outputs))


def pip_requirements(text: bool = False) -> list[str]:
    """What serving imports: with text, `tokenizers` too (the transform holds its JSON)."""
    from importlib.metadata import version

    return [
        *([f"tokenizers=={version('tokenizers')}"] if text else []),
        f"airflow-trainpipe=={version('airflow-trainpipe')}",
        f"torch=={torch.__version__.split('+')[0]}",
        f"numpy=={np.__version__}",
        f"pyarrow=={pa.__version__}",
        f"pandas=={version('pandas')}",
        f"cloudpickle=={version('cloudpickle')}",
    ]
