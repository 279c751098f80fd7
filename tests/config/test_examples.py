"""The shipped example configs load and mean what they say."""

from __future__ import annotations

from datetime import date, timedelta

from airflow_trainpipe.config import load_config
from tests.conftest import EXAMPLE_CONFIGS


def test_fraud_detector_is_a_nightly_classifier_gated_on_auc() -> None:
    config = load_config(EXAMPLE_CONFIGS / "fraud_detector.yaml")
    assert config.pipeline == "fraud_detector"
    assert config.schedule.cron == "0 2 * * *"
    assert config.schedule.start_date == date(2026, 1, 1)
    assert config.schedule.retry_delay == timedelta(minutes=2)
    assert config.training.task == "binary_classification"
    assert config.training.launcher == "local"
    assert config.training.resources.nproc_per_node == 2
    assert config.training.checkpoint.async_upload is True
    assert config.gate.metric == "roc_auc"
    assert config.gate_direction == "maximize"
    assert [g.metric for g in config.gate.guardrails] == ["log_loss", "recall"]
    assert config.registration.alias == "champion"
    assert config.registered_model_name == "fraud_detector"
    assert config.data.features.all[:2] == ["amount", "hour"]


def test_house_prices_is_a_weekly_multi_node_regression() -> None:
    config = load_config(EXAMPLE_CONFIGS / "house_prices.yaml")
    assert config.schedule.cron == "@weekly"
    assert config.schedule.timezone == "Europe/Amsterdam"
    assert config.schedule.dagrun_timeout == timedelta(hours=6)
    assert config.training.task == "regression"
    assert config.training.launcher == "kubernetes"
    assert config.training.resources.nodes == 2
    assert config.training.resources.nproc_per_node == 4  # one process per GPU by default
    assert config.gate_direction == "minimize"  # derived from rmse
    assert config.registered_model_name == "house_prices"  # defaults to the pipeline name
    assert config.training.deepspeed.overrides == {
        "zero_optimization": {"overlap_comm": True, "contiguous_gradients": True}
    }


def test_configs_are_immutable() -> None:
    import pydantic
    import pytest

    config = load_config(EXAMPLE_CONFIGS / "fraud_detector.yaml")
    with pytest.raises(pydantic.ValidationError):
        config.pipeline = "other"  # type: ignore[misc]
