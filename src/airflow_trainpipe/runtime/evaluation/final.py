"""Final evaluation (rank 0): the candidate and the current champion on the same holdout rows.

One function scores both models on the run's raw holdout rows: each model is a raw-row
predictor (the candidate through `TransformedNetwork.of(transform, network)`, the champion as
the MLflow pyfunc it was logged as, which carries its own fitted transform), and
`compute_metrics` scores the predictions against the same raw labels. Comparing with metrics the
champion logged on other data long ago is exactly what the gate must not do.

Both metric sets go onto the candidate's MLflow run (`candidate_<metric>`, `champion_<metric>`),
with tags naming the champion version and run, or `trainpipe.champion.version = none` when no
model holds the alias yet (bootstrap). A champion that cannot be scored (its model is
unreadable, it needs columns this run's data lacks, it predates raw-row models) is recorded as
`trainpipe.champion.error`; the gate then refuses to decide unless forced.

A threshold rule (`evaluation.threshold: max_f1 | {precision_at: p}`) is applied to each model
on its own scores of these rows, so both are compared at their best threshold by the same rule
rather than the candidate at a threshold fitted to this holdout against the champion at a fixed
one. The candidate's becomes `trainpipe.threshold` on its run and, once registered, its version.

With `gate.confidence`, a paired bootstrap of both prediction sets gives the interval of the
improvement (runtime/evaluation/confidence.py); with `evaluation.slices`, both are scored per slice, one
more pass over the holdout reading only the slice columns (runtime/evaluation/slices.py). Both go into
evaluation.json and the summary the gate decides on.
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pyarrow as pa
import torch

from airflow_trainpipe.contracts.artifacts import EVALUATION_ARTIFACT
from airflow_trainpipe.contracts.tags import (
    CHAMPION_ALIAS_TAG,
    CHAMPION_ERROR_TAG,
    CHAMPION_MODEL_NAME_TAG,
    CHAMPION_RUN_ID_TAG,
    CHAMPION_VERSION_TAG,
    NO_CHAMPION,
    THRESHOLD_TAG,
)
from airflow_trainpipe.registry.reads import current_champion
from airflow_trainpipe.runtime.data.transform import FittedTransform, class_indices, prepare_numeric
from airflow_trainpipe.runtime.evaluation.confidence import improvement_interval
from airflow_trainpipe.runtime.evaluation.curves import binary_curves
from airflow_trainpipe.runtime.evaluation.metrics import compute_metrics
from airflow_trainpipe.runtime.evaluation.slices import slice_scores
from airflow_trainpipe.runtime.serving import TransformedNetwork, load_registered

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.runtime.tracking import Tracker

log = logging.getLogger(__name__)

HoldoutRows: TypeAlias = pa.Table | Callable[[], Iterable[pa.Table]]
"""The raw holdout rows: a table, or a function that streams them in batches (read per pass)."""


def _tables(holdout: HoldoutRows) -> Iterable[pa.Table]:
    return [holdout] if isinstance(holdout, pa.Table) else holdout()


@dataclass
class ChampionScore:
    model_name: str
    alias: str
    version: str | None = None
    run_id: str | None = None
    metrics: dict[str, float] | None = None
    error: str | None = None
    predictions: np.ndarray | None = None  # of the holdout rows, in the candidate's row order

    def scored(self) -> tuple[np.ndarray, float] | None:
        """(predictions, the threshold its class metrics used), or None when it was not scored."""
        if self.predictions is None or self.metrics is None:
            return None
        return self.predictions, self.metrics.get("threshold", 0.5)

    def tags(self) -> dict[str, str]:
        tags = {
            CHAMPION_MODEL_NAME_TAG: self.model_name,
            CHAMPION_ALIAS_TAG: self.alias,
            CHAMPION_VERSION_TAG: self.version or NO_CHAMPION,
        }
        if self.run_id:
            tags[CHAMPION_RUN_ID_TAG] = self.run_id
        if self.error:
            tags[CHAMPION_ERROR_TAG] = self.error[:5000]
        return tags


def predictions(
    predict: Callable[[Any], Any],
    holdout: HoldoutRows,
    label: str,
    columns: list[str] | None = None,
    classes: list[str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(predictions, labels) of a raw-row predictor over the holdout, batch by batch: the labels
    raw, or with `classes` (multiclass) their class indices; the predictions (rows,), or (rows,
    classes) probabilities in the order of `classes` (a class the predictor does not know: 0)."""
    outputs, labels = [], []
    for table in _tables(holdout):
        rows = (table.select(columns) if columns is not None else table.drop_columns([label])).to_pandas()
        predicted = predict(rows)
        if classes is not None:
            outputs.append(predicted.reindex(columns=classes, fill_value=0.0).to_numpy(np.float64))
            labels.append(class_indices(table.column(label), classes).astype(np.float64))
        else:
            outputs.append(np.asarray(predicted, dtype=np.float64).reshape(-1))
            labels.append(prepare_numeric(table.column(label), label, log1p=False))
    prediction = np.concatenate(outputs)
    outputs.clear()  # one array and its parts at a time, not both at once
    return prediction, np.concatenate(labels)


def group_codes(holdout: HoldoutRows, transform: FittedTransform) -> np.ndarray | None:
    """A ranking holdout's group per row, in the order the predictions were made; else None."""
    if transform.group is None:
        return None
    return np.concatenate([transform.group_codes(table) for table in _tables(holdout)])


def score(
    predict: Callable[[Any], np.ndarray], holdout: HoldoutRows, label: str, task: str, threshold: Any = 0.5
) -> dict[str, float]:
    """Holdout metrics of a raw-row predictor (P(class 1), or values in the label's units)."""
    prediction, labels = predictions(predict, holdout, label)
    return compute_metrics(task, labels, prediction, threshold=threshold)


def _column_names(holdout: HoldoutRows) -> list[str]:
    if isinstance(holdout, pa.Table):
        return holdout.column_names
    return next(iter(holdout())).column_names


def candidate_predictor(
    model: torch.nn.Module, transform: FittedTransform, device: torch.device | None = None
) -> Callable[[Any], np.ndarray]:
    """The candidate exactly as its logged pyfunc will score: same class, same `scores` (the
    probabilities its served answer holds, without the predicted label), on `device` (None: the
    CPU, as served)."""
    predictor = TransformedNetwork.of(transform, model, device)
    return predictor.scores


def _scored(
    config: PipelineConfig,
    labels: np.ndarray,
    prediction: np.ndarray,
    groups: np.ndarray | None,
    classes: list[str] | None,
) -> dict[str, float]:
    """One model's holdout metrics, by the config's task and threshold rule."""
    return compute_metrics(
        config.training.task,
        labels,
        prediction,
        threshold=config.evaluation.threshold,
        groups=groups,
        classes=classes,
    )


def score_champion(
    client: Any,
    config: PipelineConfig,
    holdout: HoldoutRows,
    classes: list[str] | None = None,
    groups: np.ndarray | None = None,
    device: torch.device | None = None,
) -> ChampionScore:
    """The champion's scores of the holdout rows: its class probabilities in the candidate's
    `classes` order (multiclass), its ranking within the candidate's `groups` (ranking); its
    network on `device` (None: the CPU)."""
    name, alias = config.registered_model_name, config.registration.alias
    result = ChampionScore(model_name=name, alias=alias)
    found = current_champion(client, name, alias)
    if found is None:
        log.info("no version of %s holds alias %r yet: bootstrap", name, alias)
        return result
    result.version, result.run_id = found
    try:
        # The version number, not the alias: the model scored is exactly the one named in the tags.
        # Read from its artifacts (transform JSON + exported program), never its pickled pyfunc.
        with tempfile.TemporaryDirectory(prefix="trainpipe-champion-") as directory:
            model, inputs = load_registered(f"models:/{name}/{result.version}", directory, device)
        if inputs is None or inputs.is_tensor_spec():
            raise ValueError(
                "its model takes encoded tensors, not raw rows (logged before feature transforms "
                "shipped inside the model)"
            )
        present = _column_names(holdout)
        missing = [c.name for c in inputs.inputs if c.required and c.name not in present]
        if missing:
            raise ValueError(
                f"it needs column(s) {', '.join(missing)} that this run's data config does not read"
            )
        known = [c.name for c in inputs.inputs if c.name in present and c.name != config.data.label]
        prediction, labels = predictions(model.scores, holdout, config.data.label, known, classes)
        result.metrics = _scored(config, labels, prediction, groups, classes)
        result.predictions = prediction
    except Exception as exc:  # recorded for the gate, which fails with it unless forced
        if device is not None:
            # Moving an exported program is torch's pass, not ours: a program it cannot move, or a
            # device short of memory, may cost time, never the champion's score.
            log.warning(
                "champion version %s did not score on %s (%s): on the CPU", result.version, device, exc
            )
            return score_champion(client, config, holdout, classes, groups, device=None)
        result.error = f"cannot score champion {name} version {result.version} (run {result.run_id}): {type(exc).__name__}: {exc}"
        log.error("%s", result.error)
    return result


def evaluate_final(
    model: torch.nn.Module,
    transform: FittedTransform,
    holdout: HoldoutRows,
    config: PipelineConfig,
    tracker: Tracker,
    step: int,
    laps: Any = None,
    device: torch.device | None = None,
) -> tuple[dict[str, Any], np.ndarray]:
    """Score candidate and champion, record both on the candidate's run; returns the summary and
    the candidate's predictions of the holdout rows, in their order. `laps` (runtime.startup.Laps):
    the end of the job's clock, lapped after each model. `device`: where both models score (the
    training device; None: the CPU)."""
    model.eval()
    classes, groups = transform.classes, group_codes(holdout, transform)
    predict = candidate_predictor(model, transform, device)
    prediction, labels = predictions(predict, holdout, config.data.label, classes=classes)
    candidate = _scored(config, labels, prediction, groups, classes)
    if laps is not None:
        laps.lap("candidate_scored")
    champion = score_champion(tracker.client, config, holdout, classes, groups, device)
    if laps is not None:
        laps.lap("champion_scored")
    metrics = {f"candidate_{k}": v for k, v in candidate.items()}
    metrics.update({f"champion_{k}": v for k, v in (champion.metrics or {}).items()})
    ours, theirs = (prediction, candidate.get("threshold", 0.5)), champion.scored()
    slices = None
    if config.evaluation.slices:
        task, specs = config.training.task, config.evaluation.slices
        slices = slice_scores(task, specs, lambda: _tables(holdout), labels, ours, theirs, groups, classes)
    interval = _improvement_interval(config, labels, ours, theirs, groups)
    if interval is not None and all(math.isfinite(v) for v in interval):
        metrics["improvement_lower"], metrics["improvement_upper"] = interval
    tracker.log_metrics(metrics, step, flush=True)
    tracker.set_tags(champion.tags())
    if "threshold" in candidate:  # what the class metrics used; register puts it on the version
        tracker.set_tags({THRESHOLD_TAG: repr(candidate["threshold"])})
    summary = {
        "holdout_rows": len(labels),
        "candidate": candidate,
        "champion": champion.metrics,
        "champion_version": champion.version,
        "champion_run_id": champion.run_id,
        "champion_error": champion.error,
        "improvement_interval": interval,
        "slices": slices,
    }

    curves = None
    if config.training.task == "binary_classification":  # drawn by the gate's report
        curves = {
            "candidate": binary_curves(labels, prediction),
            "champion": None if champion.predictions is None else binary_curves(labels, champion.predictions),
        }
    tracker.log_dict({**summary, "curves": curves}, EVALUATION_ARTIFACT)
    if laps is not None:
        laps.lap("comparison_logged")
    return summary, prediction


def _improvement_interval(
    config: PipelineConfig,
    labels: np.ndarray,
    ours: tuple[np.ndarray, float],
    theirs: tuple[np.ndarray, float] | None,
    groups: np.ndarray | None = None,
) -> tuple[float, float] | None:
    """gate.confidence: the bootstrap interval of the primary metric's improvement; None without
    a champion scored on these rows (the gate's other rules decide then)."""
    gate = config.gate
    if gate.confidence is None or theirs is None:
        return None
    if len(labels) == 0:
        return (-math.inf, math.inf)
    return improvement_interval(
        config.training.task,
        gate.metric,
        config.gate_direction,
        labels,
        ours,
        theirs,
        confidence=gate.confidence,
        samples=gate.bootstrap_samples,
        seed=gate.bootstrap_seed,
        groups=groups,
    )
