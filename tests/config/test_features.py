"""config.features: quantile clipping, numeric and categorical transforms, and their defaults."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from airflow_trainpipe.config.features import (
    CategoricalTransform,
    FeaturesSection,
    NumericTransform,
    QuantileClip,
)


def _problems(model: type[BaseModel], **data: Any) -> dict[str, str]:
    """{dotted location: message} of the cross-field problems `data` has."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    return {
        ".".join(map(str, (*e["loc"], *loc))): message
        for e in caught.value.errors()
        for loc, message in e["ctx"]["problems"]
    }


def test_clip_defaults_are_no_bounds() -> None:
    assert (QuantileClip().lower, QuantileClip().upper) == (0.0, 1.0)


@pytest.mark.parametrize(("lower", "upper"), [(0.5, 0.5), (0.9, 0.1)])
def test_the_upper_quantile_must_be_above_the_lower(lower: float, upper: float) -> None:
    assert _problems(QuantileClip, lower=lower, upper=upper) == {
        "upper": f"upper quantile {upper} must be above lower quantile {lower}"
    }


@pytest.mark.parametrize(
    ("field", "value"), [("lower", 1.0), ("lower", -0.01), ("upper", 0.0), ("upper", 1.01)]
)
def test_quantiles_stay_within_their_range(field: str, value: float) -> None:
    with pytest.raises(ValidationError) as caught:
        QuantileClip.model_validate({field: value})
    assert [e["loc"] for e in caught.value.errors()] == [(field,)]


def test_a_narrow_clip_is_fine() -> None:
    assert QuantileClip(lower=0.001, upper=0.002).upper == 0.002


def test_numeric_defaults_fill_the_mean_and_standardize() -> None:
    numeric = NumericTransform()
    assert (numeric.log1p, numeric.clip, numeric.fill, numeric.scale) == (False, None, "mean", "standardize")
    assert not numeric.missing_indicator and not numeric.optional


def test_an_optional_numeric_column_needs_a_fill_other_than_error() -> None:
    assert _problems(NumericTransform, optional=True, fill="error") == {
        "fill": "an optional column is all missing when absent; choose a fill other than 'error'"
    }
    assert NumericTransform(fill="error").fill == "error"  # required columns may refuse missing values
    assert NumericTransform(optional=True, fill="zero").optional


def test_categorical_defaults_to_an_index_encoding_with_unknowns() -> None:
    categorical = CategoricalTransform()
    assert (categorical.encode, categorical.max_categories, categorical.buckets) == ("index", None, None)
    assert categorical.missing == "unknown"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"encode": "hash"}, {"buckets": "encode: hash needs `buckets`"}),
        (
            {"encode": "hash", "buckets": 8, "max_categories": 3},
            {"max_categories": "encode: hash has no vocabulary; use `buckets`"},
        ),
        ({"encode": "index", "buckets": 8}, {"buckets": "`buckets` is for encode: hash, not index"}),
        (
            {"encode": "one_hot"},
            {
                "max_categories": "encode: one_hot needs `max_categories` (kept values; the rest go to `other`)"
            },
        ),
        (
            {"optional": True, "missing": "error"},
            {"missing": "an optional column is all missing when absent; `missing: error` contradicts it"},
        ),
    ],
)
def test_categorical_parameters_must_fit_the_encoding(data: dict[str, Any], expected: dict[str, str]) -> None:
    assert _problems(CategoricalTransform, **data) == expected


def test_every_categorical_problem_is_reported_at_once() -> None:
    problems = _problems(CategoricalTransform, encode="one_hot", buckets=4, optional=True, missing="error")
    assert sorted(problems) == ["buckets", "max_categories", "missing"]
    assert problems["buckets"] == "`buckets` is for encode: hash, not one_hot"


@pytest.mark.parametrize(
    "data",
    [
        {"encode": "hash", "buckets": 1},
        {"encode": "one_hot", "max_categories": 3},
        {"encode": "index", "max_categories": 10},
        {"missing": "error"},
    ],
)
def test_consistent_categorical_parameters_are_accepted(data: dict[str, Any]) -> None:
    assert CategoricalTransform.model_validate(data).encode == data.get("encode", "index")


def test_columns_without_an_entry_get_the_defaults_of_their_kind() -> None:
    features = FeaturesSection()
    assert features.numeric_transform("amount") == NumericTransform()
    assert features.categorical_transform("country") == CategoricalTransform()


def test_a_configured_column_gets_its_own_transform() -> None:
    features = FeaturesSection.model_validate(
        {
            "numeric": {"amount": {"log1p": True}},
            "categorical": {"country": {"encode": "hash", "buckets": 16}},
        }
    )
    assert features.numeric_transform("amount").log1p is True
    assert features.numeric_transform("hour") == NumericTransform()
    assert features.categorical_transform("country").buckets == 16


def test_transform_problems_are_located_under_their_column() -> None:
    assert _problems(
        FeaturesSection,
        numeric={"amount": {"clip": {"lower": 0.5, "upper": 0.2}}},
        categorical={"merchant": {"encode": "hash"}},
    ) == {
        "numeric.amount.clip.upper": "upper quantile 0.2 must be above lower quantile 0.5",
        "categorical.merchant.buckets": "encode: hash needs `buckets`",
    }


def test_transforms_have_no_expression_field() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        NumericTransform.model_validate({"expression": "x * 2"})


def test_a_paired_column_is_held_to_its_partners_max_length_not_the_default() -> None:
    """`body: {pair_with: subject}` has no max_length of its own (setting one is refused), yet its
    default 128 was held to the encoder's positions: an encoder of fewer than 128 could not pair."""
    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.config.text import TextTransform, longest_input
    from tests.conftest import EXAMPLE_CONFIGS

    text = (EXAMPLE_CONFIGS / "support_tickets.yaml").read_text()
    assert "subject: {tokenizer: wordpiece, vocab_size: 800, max_length: 96}" in text
    config = parse_config(
        text.replace(
            "model_args: {hidden_size: 64,", "model_args: {max_position_embeddings: 96, hidden_size: 64,"
        )
    )
    assert longest_input(config.data.features.text, config.features.text) == 96
    transforms = {"subject": TextTransform(max_length=96), "body": TextTransform(pair_with="subject")}
    assert longest_input(["subject", "body", "notes"], transforms) == 128  # notes: an input of its own
