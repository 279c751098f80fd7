"""Great Expectations run batch by batch: which rules stream, and how their batch results merge."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.config.validation import ExpectationRule
from airflow_trainpipe.data.validation.expectations import (
    PARTIAL_EXAMPLES,
    ExpectationOutcome,
    ExpectationRunner,
    columns_of,
    import_great_expectations,
    plain,
    streamable,
)

ROWS_PER_GROUP = 5
# 20 rows in four row groups: `a` is null 4 times, all in the first group (80% of it, 20% overall),
# and 1..16 elsewhere; `c` repeats "x" once.
TABLE = pa.table(
    {
        "a": pa.array([None] * 4 + [float(v) for v in range(1, 17)], pa.float64()),
        "c": ["x", *(f"id{i:02d}" for i in range(18)), "x"],
    }
)


def _rule(type_: str, **kwargs: Any) -> ExpectationRule:
    return ExpectationRule(type=type_, kwargs=kwargs)


NOT_NULL_80 = _rule("expect_column_values_to_not_be_null", column="a", mostly=0.8)
NOT_NULL_81 = _rule("expect_column_values_to_not_be_null", column="a", mostly=0.81)
A_AT_MOST_10 = _rule("expect_column_values_to_be_between", column="a", min_value=0, max_value=10)
C_UNIQUE = _rule("expect_column_values_to_be_unique", column="c")
A_MEAN = _rule("expect_column_mean_to_be_between", column="a", min_value=8, max_value=9)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("snapshot") / "part-00000.parquet"
    pq.write_table(TABLE, path, row_group_size=ROWS_PER_GROUP)
    return path


def _run(rules: list[ExpectationRule], snapshot: Path) -> list[ExpectationOutcome]:
    """As validate.py does: row-wise rules on each row group, the others on the whole table."""
    runner = ExpectationRunner(rules)
    parquet = pq.ParquetFile(snapshot)
    for index in range(parquet.num_row_groups):
        runner.add_batch(parquet.read_row_group(index).to_pandas())
    runner.run_whole(pq.read_table(snapshot).to_pandas())
    return runner.outcomes()


@pytest.fixture(scope="module")
def outcomes(snapshot: Path) -> list[ExpectationOutcome]:
    return _run([C_UNIQUE, NOT_NULL_80, A_MEAN, NOT_NULL_81, A_AT_MOST_10], snapshot)


def _of(outcomes: list[ExpectationOutcome], rule: ExpectationRule) -> ExpectationOutcome:
    (found,) = [o for o in outcomes if o.rule == rule]
    return found


@pytest.mark.parametrize(
    ("type_", "expected"),
    [
        ("expect_column_values_to_not_be_null", True),
        ("expect_column_values_to_match_regex", True),
        ("expect_column_pair_values_a_to_be_greater_than_b", True),
        ("expect_multicolumn_sum_to_equal", True),
        ("expect_column_values_to_be_unique", False),
        ("expect_column_values_to_be_increasing", False),
        ("expect_column_mean_to_be_between", False),
        ("expect_compound_columns_to_be_unique", False),
        ("expect_table_row_count_to_be_between", False),
    ],
)
def test_only_rules_that_judge_each_row_alone_stream(type_: str, expected: bool) -> None:
    assert streamable(ExpectationRule.model_construct(type=type_, kwargs={})) is expected


@pytest.mark.parametrize(
    ("kwargs", "columns"),
    [
        ({"column": "amount", "min_value": 0}, ["amount"]),
        ({"column_A": "start", "column_B": "end"}, ["start", "end"]),
        ({"column_list": ["a", "b", "c"], "sum_total": 1}, ["a", "b", "c"]),
        ({"min_value": 1, "max_value": 9}, []),
    ],
)
def test_the_columns_a_rule_reads(kwargs: dict[str, Any], columns: list[str]) -> None:
    assert columns_of(ExpectationRule.model_construct(type="any", kwargs=kwargs)) == columns


def test_plain_turns_numpy_values_into_json_types() -> None:
    value = plain({1: (np.bool_(True), np.int64(3)), "x": [np.float32(0.5), np.array([1, 2])]})
    assert value == {"1": [True, 3], "x": [0.5, [1, 2]]}
    assert type(value["1"][0]) is bool and type(value["1"][1]) is int and type(value["x"][0]) is float


def test_a_batch_may_fail_mostly_while_the_whole_snapshot_passes(
    outcomes: list[ExpectationOutcome],
) -> None:
    passing, failing = _of(outcomes, NOT_NULL_80), _of(outcomes, NOT_NULL_81)
    # 4 nulls of 20 rows is exactly the 20% that mostly=0.8 allows; 19% is not.
    assert (passing.success, failing.success) == (True, False)
    assert passing.result["unexpected_count"] == 4 and passing.result["element_count"] == 20
    assert passing.result["unexpected_percent"] == 20.0 and not passing.whole_column


def test_merged_counts_leave_missing_values_out_of_the_share(
    outcomes: list[ExpectationOutcome],
) -> None:
    outcome = _of(outcomes, A_AT_MOST_10)
    assert not outcome.success and outcome.error is None
    assert (outcome.result["element_count"], outcome.result["missing_count"]) == (20, 4)
    assert outcome.result["unexpected_count"] == 6  # 11..16
    assert outcome.result["unexpected_percent"] == 37.5  # 6 of the 16 non-null values
    assert outcome.result["partial_unexpected_list"] == [11.0, 12.0, 13.0, 14.0, 15.0, 16.0]


def test_whole_column_rules_see_every_row_at_once(
    outcomes: list[ExpectationOutcome],
) -> None:
    unique, mean = _of(outcomes, C_UNIQUE), _of(outcomes, A_MEAN)
    assert unique.whole_column and not unique.success  # the two "x" are 19 rows apart
    assert unique.result["unexpected_count"] == 2
    assert mean.whole_column and mean.success and mean.result["observed_value"] == 8.5  # mean of 1..16


def test_streamed_outcomes_come_before_whole_column_ones(
    outcomes: list[ExpectationOutcome],
) -> None:
    assert [o.rule for o in outcomes] == [NOT_NULL_80, NOT_NULL_81, A_AT_MOST_10, C_UNIQUE, A_MEAN]


def test_unexpected_examples_stop_at_the_limit_across_batches() -> None:
    runner = ExpectationRunner([_rule("expect_column_values_to_be_between", column="v", max_value=0)])
    for start in (1, 11, 21):
        runner.add_batch(pa.table({"v": list(range(start, start + 10))}).to_pandas())
    (outcome,) = runner.outcomes()
    assert outcome.result["unexpected_count"] == 30
    assert outcome.result["partial_unexpected_list"] == list(range(1, PARTIAL_EXAMPLES + 1))


def test_without_row_wise_rules_batches_are_not_validated() -> None:
    runner = ExpectationRunner([A_MEAN])
    runner.add_batch(None)  # never handed to GX
    runner.run_whole(TABLE.to_pandas())
    (outcome,) = runner.outcomes()
    assert outcome.whole_column and outcome.result == {"observed_value": 8.5}


def test_data_docs_show_the_counts_merged_over_all_batches(snapshot: Path) -> None:
    runner = ExpectationRunner([NOT_NULL_81])
    for index in range(pq.ParquetFile(snapshot).num_row_groups):
        runner.add_batch(pq.ParquetFile(snapshot).read_row_group(index).to_pandas())
    html = runner.data_docs_html(runner.outcomes())
    assert html is not None
    assert "4 unexpected values found" in html and "of 20 total rows" in html


def test_a_rule_that_raises_reports_its_error_and_leaves_the_others_results_alone(snapshot: Path) -> None:
    on_strings = _rule("expect_column_values_to_be_between", column="c", min_value=0, max_value=10)
    not_null = _rule("expect_column_values_to_not_be_null", column="a")
    found = _run([not_null, on_strings], snapshot)
    assert _of(found, not_null).result["unexpected_count"] == 4
    assert _of(found, not_null).result["element_count"] == 20
    assert not _of(found, on_strings).success and _of(found, on_strings).error is not None


def test_gx_says_nothing_about_itself_in_the_task_log(caplog: pytest.LogCaptureFixture) -> None:
    # Its INFO records (skipped closures at import, each context's ephemeral docs folder) were
    # half of make demo's task logs. Its warnings still show.
    gx_logger = logging.getLogger("great_expectations")
    gx_logger.setLevel(logging.NOTSET)  # as a task process finds it
    with caplog.at_level(logging.INFO):
        runner = ExpectationRunner([A_MEAN])
        runner.run_whole(TABLE.to_pandas())
        logging.getLogger("great_expectations.data_context").warning("a warning of GX's")
    said = [
        (r.name, r.levelname, r.getMessage())
        for r in caplog.records
        if r.name.startswith("great_expectations")
    ]
    assert said == [("great_expectations.data_context", "WARNING", "a warning of GX's")]


def test_a_level_the_deployment_set_on_gx_is_kept() -> None:
    gx_logger = logging.getLogger("great_expectations")
    gx_logger.setLevel(logging.DEBUG)
    try:
        import_great_expectations()
        assert gx_logger.level == logging.DEBUG
    finally:
        gx_logger.setLevel(logging.NOTSET)
