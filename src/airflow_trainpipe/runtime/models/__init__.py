"""The model registry: built-in models and those installed packages register.

A plugin declares `[project.entry-points."airflow_trainpipe.models"] name = "pkg.mod:builder"`.
A builder with an `inputs` parameter is called as `builder(inputs=ModelInputs, task=...,
num_outputs=..., **model_args)` and returns a module whose forward takes the mapping of
`runtime.models.inputs` (numeric, categorical codes, token ids and attention mask per text input):
any architecture, text or not. A builder without it keeps the first contract and cannot be given
text: `builder(num_numeric=..., cardinalities=[...], task=..., **model_args)` returning a module
mapping a float32 (batch, features) tensor to (batch, 1) outputs, and for
`multiclass_classification` also `num_outputs=` (the number of classes), returning (batch,
num_outputs) logits.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import torch

from airflow_trainpipe.config.catalog import MODEL_ENTRY_POINT_GROUP, available_models
from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.runtime.models.inputs import MappedInputs, ModelInputs


def _builtin(name: str) -> Callable[..., torch.nn.Module]:
    if name == "tabular_mlp":
        from airflow_trainpipe.runtime.models.tabular_mlp import build_tabular_mlp

        return build_tabular_mlp
    if name == "text_encoder":
        from airflow_trainpipe.runtime.models.text_encoder import build_text_encoder

        return build_text_encoder
    raise KeyError(name)


def takes_inputs(builder: Callable[..., Any]) -> bool:
    """Whether a builder follows the mapping contract (it has an `inputs` parameter)."""
    return "inputs" in inspect.signature(builder).parameters


def build_model(
    name: str,
    *,
    inputs: ModelInputs | None = None,
    pretrained: str | None = None,
    activation_checkpointing: bool = False,
    attention: str | None = None,
    **kwargs: Any,
) -> torch.nn.Module:
    """The model `name`, taking the flat input row. With `inputs` (what the training job passes),
    a mapping builder gets them and its model is wrapped in `MappedInputs`; a builder of the first
    contract gets `num_numeric` and `cardinalities` from them. Without, `kwargs` are the first
    contract's, passed as they are. `pretrained`: a checked local directory (runtime.pretrained),
    for a builder with a `pretrained` parameter; `attention`: transformers' attention kernel
    (training.speed.attention), for a builder with an `attention` parameter."""
    builder = _builder(name)
    if pretrained is not None:
        if "pretrained" not in inspect.signature(builder).parameters:
            raise TrainpipeError(
                f"model {name!r} takes no pretrained weights (its builder has no `pretrained` parameter)"
            )
        kwargs = {**kwargs, "pretrained": pretrained}
    if activation_checkpointing:
        if "activation_checkpointing" not in inspect.signature(builder).parameters:
            raise TrainpipeError(
                f"model {name!r} cannot recompute activations (training.activation_checkpointing): its "
                "builder has no `activation_checkpointing` parameter"
            )
        kwargs = {**kwargs, "activation_checkpointing": True}
    if attention is not None:
        if "attention" not in inspect.signature(builder).parameters:
            raise TrainpipeError(
                f"model {name!r} has no attention kernel to choose (training.speed.attention "
                f"{attention}): its builder has no `attention` parameter; leave it auto"
            )
        kwargs = {**kwargs, "attention": attention}
    if inputs is None:
        return _called(name, builder, kwargs)
    if takes_inputs(builder):
        return MappedInputs(_called(name, builder, {"inputs": inputs, **kwargs}), inputs)
    if inputs.text:
        raise TrainpipeError(
            f"model {name!r} takes no text inputs (its builder has no `inputs` parameter): "
            f"remove data.features.text, or use text_encoder or a builder of the mapping contract"
        )
    legacy = {k: v for k, v in kwargs.items() if k != "num_outputs" or v > 1}  # single-output plugins
    return _called(
        name, builder, {"num_numeric": inputs.num_numeric, "cardinalities": inputs.cardinalities, **legacy}
    )


def _builder(name: str) -> Callable[..., torch.nn.Module]:
    try:
        return _builtin(name)
    except KeyError:
        matches = [ep for ep in entry_points(group=MODEL_ENTRY_POINT_GROUP) if ep.name == name]
        if not matches:
            raise TrainpipeError(
                f"unknown model {name!r}; available: {', '.join(sorted(available_models()))}"
            ) from None
        return matches[0].load()  # type: ignore[no-any-return]


def _called(name: str, builder: Callable[..., torch.nn.Module], kwargs: dict[str, Any]) -> torch.nn.Module:
    try:
        return builder(**kwargs)
    except (TypeError, ValueError) as exc:
        raise TrainpipeError(
            f"model {name!r} rejected its arguments (training.hyperparameters.model_args): {exc}"
        ) from exc
