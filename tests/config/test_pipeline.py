"""config.pipeline: the whole config, the checks across its sections, and its derived properties."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from pydantic import ValidationError

from airflow_trainpipe.config.pipeline import PipelineConfig


@pytest.fixture
def raw() -> dict[str, Any]:
    """A minimal valid regression pipeline as the YAML loader hands it over."""
    return {
        "pipeline": "house_prices",
        "schedule": {"cron": "@daily", "start_date": "2026-01-01", "retry_delay": "2m"},
        "data": {
            "uri": "data/houses",
            "label": "price",
            "features": {"numeric": ["area", "rooms"], "categorical": ["city"]},
        },
        "training": {"model": "tabular_mlp", "task": "regression"},
        "gate": {"metric": "rmse"},
    }


def _cross_field(raw: dict[str, Any]) -> dict[str, str]:
    """{dotted field path: message} of the cross-section problems of `raw`."""
    with pytest.raises(ValidationError) as caught:
        PipelineConfig.model_validate(raw)
    [error] = caught.value.errors()
    assert error["type"] == "cross_field", error
    return {".".join(map(str, loc)): message for loc, message in error["ctx"]["problems"]}


def test_a_minimal_pipeline_gets_every_optional_section(raw: dict[str, Any]) -> None:
    config = PipelineConfig.model_validate(raw)
    assert (config.owner, config.description, config.tags) == ("airflow", None, [])
    assert config.features.numeric == {} and config.validation.drift is None
    assert config.registration.alias == "champion"


def test_the_registered_name_defaults_to_the_pipeline(raw: dict[str, Any]) -> None:
    assert PipelineConfig.model_validate(raw).registered_model_name == "house_prices"
    raw["register"] = {"model_name": "houses.eu"}
    assert PipelineConfig.model_validate(raw).registered_model_name == "houses.eu"


def test_sections_named_like_pydantic_methods_are_read_under_their_yaml_names(raw: dict[str, Any]) -> None:
    raw["register"] = {"alias": "prod"}
    raw["validation"] = {"schema": {"allow_extra_columns": True}}
    config = PipelineConfig.model_validate(raw)
    assert config.registration.alias == "prod" and config.validation.contract.allow_extra_columns


@pytest.mark.parametrize(("metric", "direction"), [("rmse", "minimize"), ("r2", "maximize")])
def test_the_gate_direction_follows_the_metric(raw: dict[str, Any], metric: str, direction: str) -> None:
    raw["gate"] = {"metric": metric}
    assert PipelineConfig.model_validate(raw).gate_direction == direction
    raw["gate"]["direction"] = direction
    assert PipelineConfig.model_validate(raw).gate_direction == direction


def test_a_classification_metric_is_not_a_regression_metric(raw: dict[str, Any]) -> None:
    raw["gate"] = {"metric": "roc_auc"}
    assert _cross_field(raw) == {
        "gate.metric": "'roc_auc' is not a regression metric; expected one of rmse, mae, mape, r2"
    }


def test_a_direction_against_the_metric_says_which_way_is_better(raw: dict[str, Any]) -> None:
    raw["gate"] = {"metric": "r2", "direction": "minimize"}
    assert _cross_field(raw) == {
        "gate.direction": "r2 is better when it is higher; direction must be 'maximize', got 'minimize'"
    }


def test_guardrails_must_be_other_metrics_of_the_task(raw: dict[str, Any]) -> None:
    raw["gate"] = {"metric": "rmse", "guardrails": [{"metric": "mae"}, {"metric": "rmse"}, {"metric": "mea"}]}
    assert _cross_field(raw) == {
        "gate.guardrails.1.metric": "the primary metric cannot also be a guardrail",
        "gate.guardrails.2.metric": "'mea' is not a regression metric (did you mean 'mae'?); "
        "expected one of rmse, mae, mape, r2",
    }


def test_transforms_name_features_of_their_own_kind(raw: dict[str, Any]) -> None:
    raw["features"] = {
        "numeric": {"area": {"log1p": True}, "city": {}, "roms": {}},
        "categorical": {"rooms": {}},
    }
    assert _cross_field(raw) == {
        "features.numeric.city": "no numeric transform for 'city': it is a categorical feature in data.features",
        "features.numeric.roms": "no numeric transform for 'roms': it is not a numeric feature in "
        "data.features (did you mean 'rooms'?)",
        "features.categorical.rooms": "no categorical transform for 'rooms': it is a numeric feature in data.features",
    }


def test_drift_thresholds_name_features(raw: dict[str, Any]) -> None:
    raw["validation"] = {"drift": {"feature_thresholds": {"city": 0.3, "price": 0.3}}}
    assert _cross_field(raw) == {
        "validation.drift.feature_thresholds.price": "'price' is not a feature in data.features"
    }


def test_a_contract_must_cover_the_label_features_and_split_key(raw: dict[str, Any]) -> None:
    raw["data"]["holdout"] = {"key_column": "house_id"}
    raw["validation"] = {"schema": {"columns": {"area": "double", "rooms": "int64", "city": "string"}}}
    assert _cross_field(raw) == {
        "validation.schema.columns": "the contract leaves out 'price', 'house_id', which data uses "
        "(label, features, holdout key, group)"
    }
    raw["validation"]["schema"]["columns"].update(price="double", house_id="string")
    assert PipelineConfig.model_validate(raw).validation.contract.columns["house_id"] == "string"


def test_the_split_key_cannot_be_the_label(raw: dict[str, Any]) -> None:
    raw["data"]["holdout"] = {"key_column": "price"}
    assert _cross_field(raw) == {"data.holdout.key_column": "the split key cannot be the label column"}


def test_pods_must_reach_the_data(raw: dict[str, Any]) -> None:
    raw["training"].update(
        launcher="kubernetes",
        image="registry/trainer:1.0",
        checkpoint={"uri": "s3://bucket/checkpoints"},
    )
    problems = _cross_field(raw)
    assert list(problems) == ["data.uri"]
    assert problems["data.uri"].startswith("'data/houses' is relative to the Airflow worker's TRAINPIPE_HOME")
    raw["data"]["uri"] = "s3://bucket/houses"
    assert PipelineConfig.model_validate(raw).training.launcher == "kubernetes"


def test_a_local_pipeline_may_read_relative_data(raw: dict[str, Any]) -> None:
    assert PipelineConfig.model_validate(raw).data.uri == "data/houses"


def test_the_content_hash_is_a_sha256(raw: dict[str, Any]) -> None:
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", PipelineConfig.model_validate(raw).content_hash)


def test_the_content_hash_depends_on_values_not_on_how_they_are_written(raw: dict[str, Any]) -> None:
    before = PipelineConfig.model_validate(raw).content_hash
    spelled = copy.deepcopy(raw)
    spelled["schedule"].update(retry_delay="120s", timezone="UTC")  # same duration; the default zone
    spelled["data"] = dict(reversed(list(spelled["data"].items())))
    assert PipelineConfig.model_validate(spelled).content_hash == before


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("schedule", "retry_delay", "3m"), ("gate", "min_improvement", 0.01), ("data", "format", "csv")],
)
def test_any_setting_that_differs_changes_the_content_hash(
    raw: dict[str, Any], section: str, key: str, value: Any
) -> None:
    before = PipelineConfig.model_validate(raw).content_hash
    raw[section][key] = value
    assert PipelineConfig.model_validate(raw).content_hash != before


def test_every_cross_section_problem_is_reported_together(raw: dict[str, Any]) -> None:
    raw["gate"] = {"metric": "auc"}
    raw["data"]["holdout"] = {"key_column": "price"}
    raw["features"] = {"categorical": {"zip": {}}}
    assert sorted(_cross_field(raw)) == ["data.holdout.key_column", "features.categorical.zip", "gate.metric"]


def test_a_ranking_pipeline_names_its_query_column(raw: dict[str, Any]) -> None:
    raw["training"]["task"], raw["gate"]["metric"] = "ranking", "ndcg_at_10"
    assert _cross_field(raw) == {
        "data.group": "task ranking needs the query column its rows are ranked within"
    }
    raw["data"]["group"] = "session"
    config = PipelineConfig.model_validate(raw)
    assert (config.data.split_key, config.gate_direction) == ("session", "maximize")
    raw["data"]["holdout"] = {"key_column": "house_id"}
    assert _cross_field(raw) == {
        "data.holdout.key_column": "a ranking holdout keeps whole groups, split by data.group 'session'; "
        "remove key_column 'house_id'"
    }


def test_a_group_belongs_to_ranking_only(raw: dict[str, Any]) -> None:
    raw["data"]["group"] = "session"
    assert _cross_field(raw) == {"data.group": "group applies to task ranking, not regression"}


def test_the_group_column_is_neither_the_label_nor_a_feature(raw: dict[str, Any]) -> None:
    raw["training"]["task"], raw["gate"]["metric"] = "ranking", "mrr"
    raw["data"]["group"] = "city"
    with pytest.raises(ValidationError, match="group column 'city' is also the label or a feature"):
        PipelineConfig.model_validate(raw)


@pytest.mark.parametrize(
    ("task", "metric", "why"),
    [
        ("multiclass_classification", "macro_f1", "predicts the most probable class"),
        ("regression", "rmse", "predicts values, not classes"),
    ],
)
def test_a_threshold_is_for_binary_classification_only(
    raw: dict[str, Any], task: str, metric: str, why: str
) -> None:
    raw["training"]["task"], raw["gate"]["metric"] = task, metric
    raw["evaluation"] = {"threshold": "max_f1"}
    assert _cross_field(raw) == {
        "evaluation.threshold": f"a {task} model {why}: a threshold applies to binary_classification only"
    }


def test_seed_001_s_ranking_gate_is_written_in_yaml() -> None:
    from airflow_trainpipe.config import load_config
    from tests.conftest import EXAMPLE_CONFIGS

    config = load_config(EXAMPLE_CONFIGS / "search_ranking.yaml")
    assert (config.gate.metric, config.gate.min_relative_improvement) == ("ndcg_at_10", 0.005)
    assert (config.training.task, config.data.group, config.data.split_key) == (
        "ranking",
        "query_id",
        "query_id",
    )


def test_cross_section_problems_come_in_the_order_of_their_rules(raw: dict[str, Any]) -> None:
    # The rules live beside their sections; PipelineConfig gathers them in one fixed order.
    raw["gate"] = {"metric": "auc"}
    raw["features"] = {"categorical": {"zip": {}}}
    raw["data"]["holdout"] = {"key_column": "price"}
    raw["evaluation"] = {"threshold": "max_f1"}
    raw["schedule"]["deadline"] = "6h"
    raw["canary"] = {"alias": "champion", "checks": {"max_disagreement": None}}
    assert list(_cross_field(raw)) == [
        "gate.metric",
        "features.categorical.zip",
        "data.holdout.key_column",
        "evaluation.threshold",
        "schedule.deadline",
        "canary.alias",
    ]
