"""The built-in models' arguments as the config knows them, held to the builders themselves."""

from __future__ import annotations

import inspect

import pytest

from airflow_trainpipe.config.catalog import BUILTIN_MODELS
from airflow_trainpipe.config.model_args import BUILTIN_MODEL_ARGS, model_args_problems

# What the job passes every builder itself (runtime/setup.py `_build_model`, runtime/models).
PASSED_BY_THE_JOB = {
    "inputs", "task", "num_outputs", "pretrained", "activation_checkpointing", "attention",
    "num_numeric", "cardinalities",
}  # fmt: skip


@pytest.mark.parametrize("model", BUILTIN_MODELS)
def test_each_builtin_models_arguments_are_its_builders(model: str) -> None:
    from airflow_trainpipe.runtime.models import _builtin

    parameters = inspect.signature(_builtin(model)).parameters
    assert set(BUILTIN_MODEL_ARGS[model]) == set(parameters) - PASSED_BY_THE_JOB


def test_a_model_from_an_entry_point_is_its_builders_to_judge() -> None:
    assert model_args_problems("my_model", {"anything": 1, "dropout": 7}, ("model_args",)) == []
