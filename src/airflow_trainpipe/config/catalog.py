"""What a config may name: tasks, their metrics, and the model registry.

Known here by name only: the config layer checks a name without importing the thing it names
(the metrics live in the runtime, plugin models in other distributions).
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from typing import Literal

Task = Literal["binary_classification", "multiclass_classification", "regression", "ranking"]
Direction = Literal["maximize", "minimize"]

# The k of ranking's ndcg_at_k and map_at_k.
NDCG_CUTOFFS: tuple[int, ...] = (1, 3, 5, 10, 20)
MAP_CUTOFFS: tuple[int, ...] = (5, 10)

# binary_classification's metrics that depend on `evaluation.threshold` (the rest rank the scores).
THRESHOLD_METRICS = frozenset({"accuracy", "precision", "recall", "f1"})

# Metrics the runtime's holdout evaluation computes per task, with the direction that is better.
METRICS: dict[str, dict[str, Direction]] = {
    "binary_classification": {
        "roc_auc": "maximize",
        "pr_auc": "maximize",
        "log_loss": "minimize",
        "brier": "minimize",
        "accuracy": "maximize",
        "precision": "maximize",
        "recall": "maximize",
        "f1": "maximize",
    },
    "multiclass_classification": {
        "accuracy": "maximize",
        "balanced_accuracy": "maximize",
        "macro_f1": "maximize",
        "log_loss": "minimize",
    },
    "regression": {
        "rmse": "minimize",
        "mae": "minimize",
        "mape": "minimize",
        "r2": "maximize",
    },
    # Means over the holdout's groups (queries) that hold at least one relevant row.
    "ranking": {
        **{f"ndcg_at_{k}": "maximize" for k in NDCG_CUTOFFS},
        "ndcg": "maximize",
        **{f"map_at_{k}": "maximize" for k in MAP_CUTOFFS},
        "map": "maximize",
        "mrr": "maximize",
    },
}

# A multiclass model's metrics also hold `recall_<class>` per class, named after the data's values.

BUILTIN_MODELS: tuple[str, ...] = ("tabular_mlp", "text_encoder")

# Installed packages add models by declaring, in their pyproject.toml:
#   [project.entry-points."airflow_trainpipe.models"]
#   my_model = "my_package.models:build_my_model"
# The YAML then says `model: my_model`; it never contains an import path.
MODEL_ENTRY_POINT_GROUP = "airflow_trainpipe.models"


@cache
def available_models() -> dict[str, str]:
    """Model names a config may use, each with where it comes from. Loads no plugin code.

    Cached: scanning entry points costs ~15 ms, paid once per process instead of per config
    (installing a plugin needs a process restart anyway).
    """
    models = dict.fromkeys(BUILTIN_MODELS, "built-in")
    for ep in entry_points(group=MODEL_ENTRY_POINT_GROUP):
        if ep.name not in models:
            dist = ep.dist.name if ep.dist is not None else "unknown distribution"
            models[ep.name] = f"entry point from {dist}"
    return models
