"""config.feature_store: `data.feature_store`, located problems and its cross-section rules."""

from __future__ import annotations

import pytest

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.config.feature_store import FeatureStoreSection
from airflow_trainpipe.core.exceptions import ConfigError
from tests.conftest import EXAMPLE_CONFIGS

FRAUD = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
STORE = (
    "  feature_store:\n    repo: feast/repo\n    timestamp_column: event_time\n"
    "    features: [card_activity:txn_count_7d, card_activity:amount_mean_7d]\n"
)


def _with_store(block: str = STORE, text: str = FRAUD) -> str:
    return text.replace("  format: parquet\n", "  format: parquet\n" + block)


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "x.yaml")
    return [str(p) for p in caught.value.problems]


def test_a_feature_store_section_parses_with_its_defaults() -> None:
    section = parse_config(_with_store(), "x.yaml").data.feature_store
    assert section == FeatureStoreSection(
        repo="feast/repo",
        timestamp_column="event_time",
        features=["card_activity:txn_count_7d", "card_activity:amount_mean_7d"],
    )
    assert (section.materialize, section.full_feature_names, section.python) == (True, False, None)
    assert section.selection == "card_activity:txn_count_7d, card_activity:amount_mean_7d"


def test_pipelines_without_a_feature_store_have_none() -> None:
    assert parse_config(FRAUD, "x.yaml").data.feature_store is None


def test_features_and_a_feature_service_are_one_or_the_other() -> None:
    both = STORE + "    feature_service: fraud_features\n"
    (problem,) = _problems(_with_store(both))
    assert (
        "data.feature_store.features: give either features (view:feature references) or feature_service"
        in problem
    )
    neither = STORE.replace("    features: [card_activity:txn_count_7d, card_activity:amount_mean_7d]\n", "")
    (problem,) = _problems(_with_store(neither))
    assert "data.feature_store.features: give either features" in problem
    service = neither + "    feature_service: fraud_features\n"
    assert (
        parse_config(_with_store(service), "x.yaml").data.feature_store.selection
        == "feature service fraud_features"
    )


@pytest.mark.parametrize("reference", ["txn_count_7d", "card_activity:", ":txn", "a:b:c", " a:b"])
def test_a_reference_that_is_not_view_colon_feature_is_located(reference: str) -> None:
    block = STORE.replace("card_activity:amount_mean_7d", repr(reference))
    (problem,) = _problems(_with_store(block))
    assert (
        f"data.feature_store.features[1]: expected a Feast reference view:feature, got {reference!r}"
        in problem
    )


def test_a_reference_listed_twice_is_refused() -> None:
    block = STORE.replace("card_activity:amount_mean_7d", "card_activity:txn_count_7d")
    (problem,) = _problems(_with_store(block))
    assert "data.feature_store.features: lists card_activity:txn_count_7d more than once" in problem


def test_an_unknown_key_lists_the_section_s_keys() -> None:
    (problem,) = _problems(_with_store(STORE + "    ttl: 3d\n"))
    assert "data.feature_store.ttl: unknown key 'ttl'" in problem
    assert problem.endswith(
        "allowed keys: repo, features, feature_service, timestamp_column, full_feature_names, materialize, python"
    )


def test_the_sql_engine_cannot_validate_joined_features() -> None:
    sql = "  source:\n    kind: sql\n    conn_id: dwh\n    query: SELECT * FROM t\n    order_by: [transaction_id]\n"
    text = FRAUD.replace("    marker: _SUCCESS", "").replace("  format: parquet\n", sql + STORE)
    text = text.replace("validation:\n", "validation:\n  engine: sql\n", 1)
    (problem,) = _problems(text)
    assert "validation.engine: engine 'sql' checks the query's rows in the database" in problem
    assert parse_config(text.replace("  engine: sql\n", ""), "x.yaml").data.feature_store is not None
