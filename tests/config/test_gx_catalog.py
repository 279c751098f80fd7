"""The generated expectation catalog matches the installed Great Expectations."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from airflow_trainpipe.config.gx_catalog import ENGINES, EXPECTATIONS

GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "gen_gx_catalog.py"


def test_catalog_matches_installed_great_expectations() -> None:
    spec = importlib.util.spec_from_file_location("gen_gx_catalog", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.build_catalog() == EXPECTATIONS, "run `make gx-catalog` after upgrading great_expectations"


def test_catalog_includes_the_expectations_the_examples_use() -> None:
    assert EXPECTATIONS["expect_column_values_to_be_between"][0] == ("column",)
    assert "quantile_ranges" in EXPECTATIONS["expect_column_quantile_values_to_be_between"][0]


def test_engines_match_installed_great_expectations() -> None:
    spec = importlib.util.spec_from_file_location("gen_gx_catalog", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.build_engines() == ENGINES, "run `make gx-catalog` after upgrading great_expectations"
    assert ENGINES.keys() == EXPECTATIONS.keys()
    # the gaps measured on PostgreSQL: no SQL implementation of these
    assert ENGINES["expect_column_values_to_be_increasing"] == ("stream",)
    assert ENGINES["expect_column_values_to_be_json_parseable"] == ("stream", "spark")
    assert ENGINES["expect_column_values_to_be_between"] == ("stream", "sql", "spark")
    # Spark: no dateutil or LIKE implementation, and no row order for increasing/decreasing
    assert ENGINES["expect_column_values_to_be_dateutil_parseable"] == ("stream",)
    assert ENGINES["expect_column_values_to_match_like_pattern"] == ("sql",)
    assert ENGINES["expect_column_values_to_be_decreasing"] == ("stream",)
