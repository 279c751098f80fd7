"""Final evaluation (rank 0): the candidate and the current champion on the same holdout rows.

One function scores both models: each encodes the run's raw holdout rows with its own encoder
(the champion's `encoder.json` from its training run), predicts, and `compute_metrics` scores
the predictions against the same raw labels. Comparing with metrics the champion logged on
other data long ago is exactly what the gate must not do.

Both metric sets go onto the candidate's MLflow run (`candidate_<metric>`, `champion_<metric>`),
with tags naming the champion version and run, or `trainpipe.champion.version = none` when no
model holds the alias yet (bootstrap). A champion that cannot be scored (its model or encoder
is unreadable, it needs columns this run's data lacks) is recorded as
`trainpipe.champion.error`; the gate then refuses to decide unless forced.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch

from airflow_trainpipe.runtime.data import TabularEncoder, _numeric
from airflow_trainpipe.runtime.metrics import compute_metrics

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.runtime.tracking import Tracker

log = logging.getLogger(__name__)

NO_CHAMPION = "none"
BATCH = 4096


@dataclass
class ChampionScore:
    model_name: str
    alias: str
    version: str | None = None
    run_id: str | None = None
    metrics: dict[str, float] | None = None
    error: str | None = None

    def tags(self) -> dict[str, str]:
        tags = {
            "trainpipe.champion.model_name": self.model_name,
            "trainpipe.champion.alias": self.alias,
            "trainpipe.champion.version": self.version or NO_CHAMPION,
        }
        if self.run_id:
            tags["trainpipe.champion.run_id"] = self.run_id
        if self.error:
            tags["trainpipe.champion.error"] = self.error[:5000]
        return tags


def score(model: torch.nn.Module, encoder: TabularEncoder, holdout: pa.Table, label: str, task: str) -> dict[str, float]:
    """Holdout metrics of `model`, fed the rows encoded by `encoder`, in the label's own units."""
    features = encoder.features(holdout)
    outputs = []
    with torch.no_grad():
        for start in range(0, len(features), BATCH):
            chunk = torch.from_numpy(features[start : start + BATCH])
            outputs.append(model(chunk).float().reshape(-1).cpu())
    raw = torch.cat(outputs).numpy().astype(np.float64)
    if task == "binary_classification":
        prediction = 1 / (1 + np.exp(-raw))
    else:
        prediction = raw * encoder.label_std + encoder.label_mean
    return compute_metrics(task, _numeric(holdout, label), prediction)


def current_champion(client: Any, model_name: str, alias: str) -> tuple[str, str] | None:
    """(version, run id) of the version holding `alias`, or None when there is none yet."""
    from mlflow.exceptions import MlflowException

    try:
        registered = client.get_registered_model(model_name)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    version = registered.aliases.get(alias)
    if version is None:
        return None
    return str(version), client.get_model_version(model_name, str(version)).run_id


def score_champion(client: Any, config: PipelineConfig, holdout: pa.Table) -> ChampionScore:
    import mlflow

    name, alias = config.registered_model_name, config.registration.alias
    result = ChampionScore(model_name=name, alias=alias)
    found = current_champion(client, name, alias)
    if found is None:
        log.info("no version of %s holds alias %r yet: bootstrap", name, alias)
        return result
    result.version, result.run_id = found
    try:
        encoder = TabularEncoder.from_json(json.dumps(mlflow.artifacts.load_dict(f"runs:/{result.run_id}/encoder.json")))
        missing = [c for c in [*encoder.numeric, *encoder.categorical] if c not in holdout.column_names]
        if missing:
            raise ValueError(f"it needs column(s) {', '.join(missing)} that this run's data config does not read")
        # The version number, not the alias: the model scored is exactly the one named in the tags.
        model = mlflow.pytorch.load_model(f"models:/{name}/{result.version}")
        result.metrics = score(model, encoder, holdout, config.data.label, config.training.task)
    except Exception as exc:  # recorded for the gate, which fails with it unless forced
        result.error = f"cannot score champion {name} version {result.version} (run {result.run_id}): {type(exc).__name__}: {exc}"
        log.error("%s", result.error)
    return result


def evaluate_final(model: torch.nn.Module, encoder: TabularEncoder, holdout: pa.Table, config: PipelineConfig,
                   tracker: Tracker, step: int) -> dict[str, Any]:
    """Score candidate and champion, record both on the candidate's run; returns the summary."""
    model.eval()
    candidate = score(model, encoder, holdout, config.data.label, config.training.task)
    champion = score_champion(tracker.client, config, holdout)
    metrics = {f"candidate_{k}": v for k, v in candidate.items()}
    metrics.update({f"champion_{k}": v for k, v in (champion.metrics or {}).items()})
    tracker.log_metrics(metrics, step, flush=True)
    tracker.set_tags(champion.tags())
    summary = {
        "holdout_rows": holdout.num_rows,
        "candidate": candidate,
        "champion": champion.metrics,
        "champion_version": champion.version,
        "champion_run_id": champion.run_id,
        "champion_error": champion.error,
    }
    tracker.log_dict(summary, "evaluation.json")
    return summary
