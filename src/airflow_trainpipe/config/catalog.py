"""What a config may name: tasks, their metrics, and the model registry.

Known here by name only: the config layer checks a name without importing the thing it names
(the metrics live in the runtime, plugin models in other distributions).
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from typing import Literal

Task = Literal["binary_classification", "regression"]
Direction = Literal["maximize", "minimize"]

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
    "regression": {
        "rmse": "minimize",
        "mae": "minimize",
        "mape": "minimize",
        "r2": "maximize",
    },
}

BUILTIN_MODELS: tuple[str, ...] = ("tabular_mlp",)

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
