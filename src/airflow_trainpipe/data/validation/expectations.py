"""Great Expectations 1.x on a snapshot, streamed in batches where an expectation allows it.

Row-wise ("map") expectations judge each row on its own, so their counts add up over batches:
they run once per batch and their results are merged. The others (uniqueness, ordering,
aggregates such as mean or quantiles, table-level ones) need the whole column: they run once on
a frame holding only the columns they name (table-level ones without a column get every column).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from airflow_trainpipe.config.validation import ExpectationRule

# Row-wise although their names say "values": each needs to see every row at once.
_WHOLE_COLUMN_VALUES = {
    "expect_column_values_to_be_unique",
    "expect_column_values_to_be_increasing",
    "expect_column_values_to_be_decreasing",
}
_ROW_WISE_OTHERS = {
    "expect_column_pair_values_to_be_equal",
    "expect_column_pair_values_a_to_be_greater_than_b",
    "expect_column_pair_values_to_be_in_set",
    "expect_select_column_values_to_be_unique_within_record",
    "expect_multicolumn_sum_to_equal",
}
# Their unexpected share is of all rows, not of the non-null ones.
_NULL_EXPECTATIONS = {"expect_column_values_to_not_be_null", "expect_column_values_to_be_null"}
PARTIAL_EXAMPLES = 20


def streamable(rule: ExpectationRule) -> bool:
    return (rule.type.startswith("expect_column_values_to_") and rule.type not in _WHOLE_COLUMN_VALUES) or (
        rule.type in _ROW_WISE_OTHERS
    )


def columns_of(rule: ExpectationRule) -> list[str]:
    kwargs = rule.kwargs
    names = [kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs]
    return [*names, *kwargs.get("column_list", [])]


def plain(value: Any) -> Any:
    """JSON-safe copy: GX 1.24 leaves numpy scalars in results (numpy.bool_ `success` from
    expect_column_quantile_values_to_be_between), which json and result stores reject."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


@dataclass
class ExpectationOutcome:
    rule: ExpectationRule
    success: bool
    result: dict[str, Any]
    whole_column: bool
    error: str | None = None


def import_great_expectations() -> Any:
    """GX, imported without its INFO records about itself reaching the task log: as it is
    imported, its public-API registry says it skips each of ~200 closures, and each context names
    its ephemeral docs folder. They were half of every day's task log in `make demo`, and nothing
    in them is about the data. GX's warnings and errors still show, and a level the deployment set
    on the `great_expectations` logger is left as it is."""
    logger = logging.getLogger("great_expectations")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)  # before the import: that is when the registry speaks
    import great_expectations as gx

    # The one module that sets its own logger to INFO as it is imported: back to its parent's.
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.NOTSET)
    return gx


class ExpectationRunner:
    """One ephemeral GX context per validation; no GX project on disk."""

    def __init__(self, rules: list[ExpectationRule]) -> None:
        gx = import_great_expectations()
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self.gx = gx
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        self.name = f"trainpipe-{uuid.uuid4().hex[:8]}"
        self.streamed, self.whole = self._split(rules)
        self._merged: list[dict[str, Any]] = [
            {
                "element_count": 0,
                "missing_count": 0,
                "unexpected_count": 0,
                "partial_unexpected_list": [],
                "success": True,
                "error": None,
            }
            for _ in self.streamed
        ]
        self._whole_results: list[Any] = []
        # Built once: constructing a GX expectation costs ~20 ms (pydantic deep copies), and a
        # suite is reused by every batch.
        self._suites = {"streamed": self._suite(self.streamed), "whole": self._suite(self.whole)}
        self._asset = self._batch_definition()

    def _split(self, rules: list[ExpectationRule]) -> tuple[list[ExpectationRule], list[ExpectationRule]]:
        """The rules run per batch and merged, and those run once on whole columns."""
        return [s for s in rules if streamable(s)], [s for s in rules if not streamable(s)]

    def _batch_definition(self) -> Any:
        """What the suites validate: here one pandas frame at a time."""
        source = self.context.data_sources.add_pandas(self.name)
        return source.add_dataframe_asset("snapshot").add_batch_definition_whole_dataframe("batch")

    def _suite(self, rules: list[ExpectationRule]) -> Any:
        from great_expectations.expectations.registry import get_expectation_impl

        suite = self.gx.ExpectationSuite(name=f"suite-{uuid.uuid4().hex[:8]}")
        for rule in rules:
            suite.add_expectation(get_expectation_impl(rule.type)(**rule.kwargs))
        return suite

    def _validate(self, frame: Any, part: str) -> Any:
        batch = self._asset.get_batch(batch_parameters={"dataframe": frame})
        return batch.validate(self._suites[part], result_format="BASIC")

    def _configuration(self, rule: ExpectationRule) -> Any:
        part = "streamed" if rule in self.streamed else "whole"
        rules = self.streamed if part == "streamed" else self.whole
        return self._suites[part].expectations[rules.index(rule)].configuration

    def _in_rule_order(self, part: str, suite_result: Any) -> list[Any]:
        # GX lists the results of expectations whose metrics raised first, not in suite order:
        # pair each result with its expectation by type and arguments.
        keys = [_config_key(e.configuration) for e in self._suites[part].expectations]
        ordered: list[Any] = [None] * len(keys)
        for evr in suite_result.results:
            key = _config_key(evr.expectation_config)
            index = next(i for i, k in enumerate(keys) if k == key and ordered[i] is None)
            ordered[index] = evr
        return ordered

    def add_batch(self, frame: Any) -> None:
        if not self.streamed:
            return
        results = self._in_rule_order("streamed", self._validate(frame, "streamed"))
        for merged, evr in zip(self._merged, results, strict=True):
            result = plain(evr.result)
            if (error := raised_error(evr.exception_info)) is not None:
                merged["error"] = merged["error"] or error
            merged["success"] = merged["success"] and bool(evr.success)
            for key in ("element_count", "missing_count", "unexpected_count"):
                merged[key] += int(result.get(key) or 0)
            room = PARTIAL_EXAMPLES - len(merged["partial_unexpected_list"])
            merged["partial_unexpected_list"] += (result.get("partial_unexpected_list") or [])[: max(room, 0)]

    def run_whole(self, frame: Any) -> None:
        if self.whole:
            self._whole_results = self._in_rule_order("whole", self._validate(frame, "whole"))

    def outcomes(self) -> list[ExpectationOutcome]:
        outcomes = []
        for rule, merged in zip(self.streamed, self._merged, strict=True):
            mostly = float(rule.kwargs.get("mostly", 1.0))
            base = merged["element_count"] - (
                0 if rule.type in _NULL_EXPECTATIONS else merged["missing_count"]
            )
            share = merged["unexpected_count"] / base if base else 0.0
            # With `mostly` < 1 a batch may fail on its own while the whole snapshot passes.
            success = merged["error"] is None and (
                merged["success"] if mostly >= 1.0 else share <= 1.0 - mostly + 1e-12
            )
            result = {
                **{k: v for k, v in merged.items() if k not in ("success", "error")},
                "unexpected_percent": round(100 * share, 6),
            }
            outcomes.append(
                ExpectationOutcome(rule, success, result, whole_column=False, error=merged["error"])
            )
        for rule, evr in zip(self.whole, self._whole_results, strict=False):
            error = raised_error(evr.exception_info)
            outcomes.append(
                ExpectationOutcome(rule, bool(evr.success) and error is None, plain(evr.result), True, error)
            )
        return outcomes

    def data_docs_html(self, outcomes: list[ExpectationOutcome]) -> str | None:
        """GX's own validation page for the merged results (counts over the whole snapshot)."""
        from great_expectations.core.expectation_validation_result import (
            ExpectationSuiteValidationResult,
            ExpectationValidationResult,
        )
        from great_expectations.render.renderer import ValidationResultsPageRenderer

        results = [
            ExpectationValidationResult(
                success=o.success,
                expectation_config=self._configuration(o.rule),
                result=o.result,
                exception_info={
                    "raised_exception": o.error is not None,
                    "exception_message": o.error,
                    "exception_traceback": None,
                },
            )
            for o in outcomes
        ]
        evaluated = len(results)
        passed = sum(o.success for o in outcomes)
        suite_result = ExpectationSuiteValidationResult(
            success=passed == evaluated,
            results=results,
            suite_name="trainpipe",
            statistics={
                "evaluated_expectations": evaluated,
                "successful_expectations": passed,
                "unsuccessful_expectations": evaluated - passed,
                "success_percent": 100.0 * passed / evaluated if evaluated else 100.0,
            },
            meta={"great_expectations_version": self.gx.__version__},
        )
        return _page_view().render(ValidationResultsPageRenderer().render(suite_result))


@cache
def _page_view() -> Any:
    """GX's Data Docs page view, one per process: each new view has its own Jinja environment and
    compiles every template again on its first render, ~0.07 s a page on 2 cores, about half of a
    600-row partition's validation; a window validating its earlier partitions renders many."""
    from great_expectations.render.view import DefaultJinjaPageView

    return DefaultJinjaPageView()


def _config_key(configuration: Any) -> str:
    kwargs = {k: v for k, v in configuration.kwargs.items() if k != "batch_id"}  # added per batch
    return json.dumps([configuration.type, kwargs], sort_keys=True, default=str)


def raised_error(info: Any) -> str | None:
    """The error of one expectation's result, or None. GX puts it at the top of exception_info
    when the expectation itself raised, and under each metric's id when one of its metrics did."""
    if not info:
        return None
    if _info_field(info, "raised_exception"):
        return str(_info_field(info, "exception_message"))
    messages = [
        str(_info_field(value, "exception_message"))
        for value in info.values()
        if not isinstance(value, str | bool) and _info_field(value, "raised_exception")
    ]
    return "; ".join(messages) or None


def _info_field(info: Any, name: str) -> Any:
    return info.get(name) if isinstance(info, dict) else getattr(info, name, None)
