"""config.catalog: the tasks, their metrics with directions, and the model names a config may use."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_trainpipe.config.catalog import (
    BUILTIN_MODELS,
    METRICS,
    MODEL_ENTRY_POINT_GROUP,
    Direction,
    Task,
    available_models,
)


def test_every_task_has_metrics_and_nothing_else_does() -> None:
    assert (
        set(METRICS)
        == set(typing.get_args(Task))
        == {
            "binary_classification",
            "multiclass_classification",
            "regression",
            "ranking",
        }
    )


def test_every_metric_direction_is_a_valid_direction() -> None:
    directions = {d for metrics in METRICS.values() for d in metrics.values()}
    assert directions == set(typing.get_args(Direction))


@pytest.mark.parametrize(
    ("task", "metric", "direction"),
    [
        ("binary_classification", "roc_auc", "maximize"),
        ("binary_classification", "log_loss", "minimize"),
        ("binary_classification", "brier", "minimize"),
        ("regression", "rmse", "minimize"),
        ("regression", "r2", "maximize"),
    ],
)
def test_metric_directions_say_which_way_is_better(task: str, metric: str, direction: str) -> None:
    assert METRICS[task][metric] == direction


def test_classification_and_regression_share_no_metric() -> None:
    assert not set(METRICS["binary_classification"]) & set(METRICS["regression"])


def test_builtin_models_are_available_and_marked_built_in() -> None:
    models = available_models()
    assert BUILTIN_MODELS == ("tabular_mlp", "text_encoder")
    assert list(models)[: len(BUILTIN_MODELS)] == list(BUILTIN_MODELS)
    assert models["tabular_mlp"] == "built-in"


@pytest.fixture
def plugin_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A real installed distribution (a dist-info on sys.path) that declares two models."""
    info = tmp_path / "acme_models-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-models\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{MODEL_ENTRY_POINT_GROUP}]\ngbdt_net = acme.models:build\ntabular_mlp = acme.models:mlp\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    available_models.cache_clear()
    yield
    available_models.cache_clear()


@pytest.mark.usefixtures("plugin_dist")
def test_plugin_models_name_their_distribution_and_never_replace_a_built_in() -> None:
    models = available_models()
    assert models["gbdt_net"] == "entry point from acme-models"
    assert models["tabular_mlp"] == "built-in"


def test_the_entry_point_scan_runs_once_per_process() -> None:
    assert available_models() is available_models()
    assert MODEL_ENTRY_POINT_GROUP == "airflow_trainpipe.models"
