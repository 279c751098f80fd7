"""The model registry: built-in models and those installed packages register.

A plugin declares `[project.entry-points."airflow_trainpipe.models"] name = "pkg.mod:builder"`;
the builder is called as `builder(num_numeric=..., cardinalities=[...], task=..., **model_args)`
and returns a torch.nn.Module mapping a float32 (batch, features) tensor to (batch, 1) outputs.
For `multiclass_classification` it also gets `num_outputs=` (the number of classes) and returns
(batch, num_outputs) logits.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import torch

from airflow_trainpipe.config.catalog import MODEL_ENTRY_POINT_GROUP, available_models
from airflow_trainpipe.core.exceptions import TrainpipeError


def _builtin(name: str) -> Callable[..., torch.nn.Module]:
    if name == "tabular_mlp":
        from airflow_trainpipe.runtime.models.tabular_mlp import build_tabular_mlp

        return build_tabular_mlp
    raise KeyError(name)


def build_model(name: str, **kwargs: Any) -> torch.nn.Module:
    try:
        builder = _builtin(name)
    except KeyError:
        matches = [ep for ep in entry_points(group=MODEL_ENTRY_POINT_GROUP) if ep.name == name]
        if not matches:
            raise TrainpipeError(
                f"unknown model {name!r}; available: {', '.join(sorted(available_models()))}"
            ) from None
        builder = matches[0].load()
    try:
        return builder(**kwargs)
    except TypeError as exc:
        raise TrainpipeError(
            f"model {name!r} rejected its arguments (training.hyperparameters.model_args): {exc}"
        ) from exc
