"""config.suggest: the 'did you mean' hint for a misspelt name."""

from __future__ import annotations

import pytest

from airflow_trainpipe.config.suggest import did_you_mean

METRICS = ("rmse", "mae", "mape", "r2")


@pytest.mark.parametrize(
    ("word", "suggestion"),
    [("mea", "mae"), ("rsme", "rmse"), ("mapee", "mape"), ("rmsee", "rmse")],
)
def test_the_closest_choice_is_suggested(word: str, suggestion: str) -> None:
    assert did_you_mean(word, METRICS) == f" (did you mean {suggestion!r}?)"


def test_only_the_single_best_match_is_named() -> None:
    assert did_you_mean("retires", ["retries", "retry_delay", "rertries"]) == " (did you mean 'retries'?)"


@pytest.mark.parametrize("word", ["accuracy", "", "x", "r3"])
def test_nothing_close_enough_gives_an_empty_hint(word: str) -> None:
    assert did_you_mean(word, METRICS) == ""


def test_no_choices_give_an_empty_hint() -> None:
    assert did_you_mean("rmse", []) == ""


def test_case_matters_for_closeness() -> None:
    assert did_you_mean("RMSE", METRICS) == ""


def test_a_non_string_word_is_compared_as_text() -> None:
    assert did_you_mean(12, ["12a", "zz"]) == " (did you mean '12a'?)"  # type: ignore[arg-type]


def test_any_iterable_of_choices_works_once() -> None:
    choices = (name for name in ("gate", "data"))
    assert did_you_mean("gaet", choices) == " (did you mean 'gate'?)"


def test_a_mapping_offers_its_keys() -> None:
    assert did_you_mean("tabular_mpl", {"tabular_mlp": "built-in"}) == " (did you mean 'tabular_mlp'?)"
