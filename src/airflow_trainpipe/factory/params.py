"""The trigger form of a pipeline DAG: Params for a manual run from the Airflow UI.

A scheduled run gets every default, and the defaults change nothing: the partition falls back
to the config's template and hyperparameters equal to the config are not overrides. The form's
defaults must also be submittable: a Param the form may leave empty accepts null and is not
required by the form (see `partition`), else the Trigger button stays disabled.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from airflow.sdk import Param

from airflow_trainpipe.config import PipelineConfig
from airflow_trainpipe.config.feature_store import ACCEPT_CHANGES_PARAM
from airflow_trainpipe.config.training import Hyperparameters
from airflow_trainpipe.contracts.tags import GATE_FORCED_TAG

PARTITION = "partition"
HYPERPARAMETERS = "hyperparameters"
FORCE = "force_registration"
TUNE = "tune"
_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


def trigger_params(config: PipelineConfig) -> dict[str, Param]:
    current = config.training.hyperparameters
    return {
        **_tuning_param(config),
        **_feature_param(config),
        PARTITION: _param(
            None,
            # Optional, so no `type`: the Airflow 3.3 trigger form requires a Param whose schema has
            # a `type` other than a list with "null", and keeps Trigger disabled while one is empty.
            # The nullable `["null", "string"]` would do, but jsonschema checks a list `type`
            # against the meta-schema at ~2x the cost (0.19 vs 0.10 ms measured, +~5% per DAG on
            # every parse). The value only ever becomes part of a path, where a non-string is no
            # worse than a mistyped one; the form itself sends a string or null.
            title="Data partition",
            description=f"Sub-path of {config.data.uri} to train on, e.g. a backfill day. "
            f"Empty: the run's own partition ({config.data.partition})."
            + (
                f" The window of {config.data.window.partitions} partitions ends there."
                if config.data.window is not None
                else ""
            ),
        ),
        HYPERPARAMETERS: _param(
            {name: getattr(current, name) for name in tunable_hyperparameters()},
            type="object",
            title="Hyperparameters",
            # Keys and types are checked by the train task, not by per-key `properties`: checking
            # those against the JSON Schema meta-schema costs ~0.8 ms on every parse of every DAG.
            description=_HYPERPARAMETERS_DESCRIPTION,
        ),
        FORCE: _param(
            False,
            type="boolean",
            title="Force registration",
            description="Promote the candidate even when the gate would keep the champion "
            f"(recorded on the model version as {GATE_FORCED_TAG}).",
        ),
    }


def _tuning_param(config: PipelineConfig) -> dict[str, Param]:
    if config.tuning is None:
        return {}
    budget = config.tuning.budget
    return {
        TUNE: _param(
            True,
            type="boolean",
            title="Tune hyperparameters",
            description=f"Run the Optuna study ({budget.trials} trials, {budget.max_parallel} at a time) and "
            "make its best trial the candidate. Off: train once with the hyperparameters below.",
        )
    }


def _feature_param(config: PipelineConfig) -> dict[str, Param]:
    if config.data.feature_store is None:
        return {}
    return {
        ACCEPT_CHANGES_PARAM: _param(
            False,
            type="boolean",
            title="Accept changed feature views",
            description="Train even though a feature view's features changed type or went away since the "
            "last run (the run otherwise stops before training, naming them); the new definitions become "
            "the ones later runs are compared with.",
        )
    }


def tune_template() -> str:
    """True unless the form turned tuning off (a scheduled run: the default, on)."""
    return f"{{{{ params.{TUNE} if params.{TUNE} is defined else True }}}}"


def _param(default: Any, **schema: Any) -> Param:
    # A declared draft-07 dialect: jsonschema checks every Param's schema against its
    # meta-schema each time a DAG is built, and the 2020-12 meta-schema costs ~7x more per
    # check (0.77 ms vs 0.10 ms measured), a cost paid for every DAG on every parse.
    return Param(default, **{"$schema": "http://json-schema.org/draft-07/schema#", **schema})


def tunable_hyperparameters() -> tuple[str, ...]:
    """The scalar hyperparameters (numbers, flags); `model_args` stays in the config."""
    return tuple(_TUNABLE)


def partition_template(config: PipelineConfig) -> str:
    """The trigger form's partition when given, else the config's own template (empty or null:
    the form sends null for an empty field, an API caller may send "")."""
    return f"{{% if params.{PARTITION} %}}{{{{ params.{PARTITION} }}}}{{% else %}}{config.data.partition}{{% endif %}}"


def hyperparameter_template() -> str:
    """The form's hyperparameters as JSON (`tojson` keeps numbers numbers)."""
    return f"{{{{ params.{HYPERPARAMETERS} | tojson }}}}"


def force_template() -> str:
    return f"{{{{ params.{FORCE} }}}}"


def _json_types(annotation: Any) -> list[str]:
    options = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else (annotation,)
    )
    kinds = []
    for option in options:
        if option is type(None):
            kinds.append("null")
            continue
        # PositiveInt and friends are Annotated[int, ...]
        base = typing.get_args(option)[0] if typing.get_origin(option) is typing.Annotated else option
        if base not in _JSON_TYPES:
            return []
        kinds.append(_JSON_TYPES[base])
    return sorted(kinds, key=lambda kind: kind == "null")


# Derived once from the model class, not for every DAG of every parse.
_TUNABLE = {
    name: kinds
    for name, field in Hyperparameters.model_fields.items()
    if (kinds := _json_types(field.annotation))
}
_HYPERPARAMETERS_DESCRIPTION = (
    "This run's training.hyperparameters; a value changed here overrides the config for this run only ("
    + ", ".join(f"{name}: {'/'.join(kinds)}" for name, kinds in _TUNABLE.items())
    + ")."
)
