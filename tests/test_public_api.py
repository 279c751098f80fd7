"""The import paths users write in DAG files, plugins and entry points keep working across the
architecture pass: Airflow's folders stayed where they were; the two ground-floor modules a DAG
file may import (`retry_policy`, `exceptions`) moved into core/ and still resolve, with a warning."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

import pytest

PUBLIC = [
    ("airflow_trainpipe.operators.validate", "DataValidateOperator"),
    ("airflow_trainpipe.operators.train", "DistributedTrainOperator"),
    ("airflow_trainpipe.operators.gate", "BaselineGateOperator"),
    ("airflow_trainpipe.operators.register", "RegisterModelOperator"),
    ("airflow_trainpipe.operators.approval", "ModelApprovalOperator"),
    ("airflow_trainpipe.operators.promote", "PromoteModelOperator"),
    ("airflow_trainpipe.operators.tune", "TuningTrialOperator"),
    ("airflow_trainpipe.sensors.snapshot", "DataSnapshotSensor"),
    ("airflow_trainpipe.hooks.mlflow", "MlflowHook"),
    ("airflow_trainpipe.triggers.source_rows", "SourceRowsTrigger"),
    ("airflow_trainpipe.links.mlflow", "MlflowRunLink"),
    ("airflow_trainpipe.notifications.email", "PipelineEmailNotifier"),
    ("airflow_trainpipe.factory", "register_pipelines"),
    ("airflow_trainpipe.config", "load_config"),
    ("airflow_trainpipe.get_provider_info", "get_provider_info"),
    ("airflow_trainpipe.cli", "main"),
    ("airflow_trainpipe.runtime.models", "build_model"),
]


@pytest.mark.parametrize(("module", "name"), PUBLIC)
def test_public_paths_import(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is not None


@pytest.mark.parametrize(
    ("old", "name"),
    [
        ("retry_policy", "TrainpipeRetryPolicy"),
        ("retry_policy", "TrainpipeRetryPolicyMixin"),
        ("exceptions", "TrainpipeError"),
    ],
)
def test_moved_ground_floor_modules_still_resolve_with_a_warning(old: str, name: str) -> None:
    moved = importlib.import_module(f"airflow_trainpipe.core.{old}")
    with pytest.warns(DeprecationWarning, match=f"moved to airflow_trainpipe.core.{old}.{name}"):
        value = getattr(importlib.import_module(f"airflow_trainpipe.{old}"), name)
    assert value is getattr(moved, name)
    with pytest.raises(AttributeError):
        importlib.import_module(f"airflow_trainpipe.{old}").no_such_name  # noqa: B018


def test_the_console_script_and_the_provider_entry_point_resolve() -> None:
    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "trainpipe"]
    assert script.value == "airflow_trainpipe.cli:main" and callable(script.load())
    (provider,) = [
        ep for ep in entry_points(group="apache_airflow_provider") if ep.value.startswith("airflow_trainpipe")
    ]
    assert provider.load()()["package-name"] == "airflow-trainpipe"
