"""What a served classifier answers, by name: the columns of its predictions, and how one answered
row is read (its predicted class, its score) by the canary, its report and `trainpipe canary-replay`.

A classifier's pyfunc (runtime/serving.py) answers a DataFrame: binary `probability` (P(class 1))
and `predicted_label` (1 when that probability is at least the version's `trainpipe.threshold`, else
0); multiclass one probability column per class, named by the class, and `predicted_label` (the
class of the highest probability, the first on a tie). Ranking scores and regression values stay
one number per row. The pyfunc and these readers live in different processes (the model server,
the router's log, an Airflow worker), so the names are spelled once, here.

Models logged before the label column answered a bare P(class 1) (binary) or class columns only
(multiclass): `predicted_class` reads those too, as the canary did then (the version's threshold,
the highest probability), so a canary of a new candidate beside an older champion compares like
with like.
"""

from __future__ import annotations

from typing import Any

PREDICTED_LABEL = "predicted_label"
"""The predicted class's column. A multiclass label whose classes include this name cannot be served
(its probability column would collide): the model is refused at logging, the class named."""
PROBABILITY = "probability"
"""A binary classifier's P(class 1) column."""
THRESHOLD_CONFIG = "threshold"
"""The key of a binary pyfunc's `model_config` holding its decision threshold: the same number as
its version's `trainpipe.threshold` tag. `mlflow.pyfunc.load_model(uri, model_config={"threshold": t})`
serves the same model at another threshold."""


def label_collision(classes: list[str] | None) -> str | None:
    """Why a multiclass model with these classes cannot answer a label column; None when it can."""
    if classes and PREDICTED_LABEL in classes:
        return (
            f"the label has a class named {PREDICTED_LABEL!r}, the name of the served model's "
            f"predicted-class column (beside one probability column per class): rename that class "
            f"in the data, e.g. map it to another value before training"
        )
    return None


def unwrap(answer: Any) -> Any:
    """A one-column answer (a pandas Series comes back as {"name": value}) is that value."""
    if isinstance(answer, dict) and len(answer) == 1:
        return next(iter(answer.values()))
    return answer


def predicted_class(answer: Any, threshold: float) -> Any:
    """One answered row's class: its `predicted_label`; of an older model, its class of highest
    probability ({class: probability}, or a list by class position), or for a bare P(class 1),
    1 at or above `threshold` (that version's own), else 0."""
    if isinstance(answer, dict):
        if PREDICTED_LABEL in answer:
            return answer[PREDICTED_LABEL]
        return max(answer, key=answer.__getitem__)
    if isinstance(answer, list):
        return max(range(len(answer)), key=answer.__getitem__)
    return int(float(answer) >= threshold)


def score(answer: Any) -> float | None:
    """One answered row's single score: a binary P(class 1) (`probability`, or a bare number from an
    older model), a ranking score, a regression value; None for multiclass (one per class)."""
    if isinstance(answer, dict) and set(answer) == {PROBABILITY, PREDICTED_LABEL}:  # binary's two columns
        answer = answer[PROBABILITY]
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        return float(answer)
    return None
