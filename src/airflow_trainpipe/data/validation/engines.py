"""What the validation engines share: an expectation outcome as a check, and, for the engines that
run the suite where the data is (`sql`: the source's database, `spark`: a Spark Connect server),
the suite run once over one batch there and a count of the rows that engine sees.

The count is compared with the manifest before any verdict is taken: the engine reads the data
again (the window query, the snapshot's files), and a verdict about other rows than the frozen
ones must not let a run train.

GX 1.24 quirks both engines code around: numpy scalars in expectation kwargs are rendered into SQL
literally (on Spark they become typed literals and passed; kwargs are made plain for both, one
rule), and `ValidationDefinition.run` cannot serialise the quantile expectation's result (a
numpy.bool_ `success`, on SQL and on Spark alike): batches are validated directly, without a
validation definition, and results made plain (expectations.plain).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_trainpipe.config.validation import ExpectationRule
from airflow_trainpipe.contracts.payloads import Check
from airflow_trainpipe.data.validation.expectations import (
    ExpectationOutcome,
    ExpectationRunner,
    columns_of,
    plain,
)

if TYPE_CHECKING:
    from airflow_trainpipe.data.validation.report import ValidationReport


class WholeSuiteRunner(ExpectationRunner):
    """The suite run once over one batch of an engine's own data source: nothing streams and
    nothing merges. Subclasses say what the batch is (`_batch_definition`, `_frame`)."""

    def __init__(self, rules: list[ExpectationRule]) -> None:
        self._rules = list(rules)
        super().__init__(rules)

    def _split(self, rules: list[ExpectationRule]) -> tuple[list[ExpectationRule], list[ExpectationRule]]:
        return [], [ExpectationRule(type=r.type, kwargs=plain(r.kwargs)) for r in rules]

    def _configuration(self, rule: ExpectationRule) -> Any:
        return self._suites["whole"].expectations[self._rules.index(rule)].configuration

    def _frame(self) -> Any:
        """The batch's data where the batch definition does not name it already (a query does)."""
        return None

    def run(self) -> list[ExpectationOutcome]:
        """Run the suite; outcomes carry the caller's rules (not the plain copies)."""
        self.run_whole(self._frame())
        outcomes = self.outcomes()
        for outcome, rule in zip(outcomes, self._rules, strict=True):
            outcome.rule = rule
        return outcomes


def suite_checks(runner: WholeSuiteRunner, report: ValidationReport) -> list[Check]:
    """Run the suite where the data is; its Data Docs page goes into the report."""
    outcomes = runner.run()
    report.data_docs_html = runner.data_docs_html(outcomes)
    return [expectation_check(o) for o in outcomes]


def rows_check(name: str, rows: int, frozen: int, seen: str, changed: str) -> Check:
    """The rows an engine counts against the manifest's: `seen` says where they were counted,
    `changed` what a difference means."""
    return Check(
        "volume",
        name,
        None,
        rows == frozen,
        rows,
        frozen,
        f"{seen} {rows} row(s), the snapshot froze {frozen}" + ("" if rows == frozen else f": {changed}"),
    )


def expectation_check(outcome: ExpectationOutcome) -> Check:
    column = next(iter(columns_of(outcome.rule)), None)
    result = outcome.result
    observed = result.get("observed_value", result.get("unexpected_count"))
    if outcome.error:
        detail = outcome.error
    elif "unexpected_count" in result:
        examples = result.get("partial_unexpected_list") or []
        detail = f"{result['unexpected_count']} unexpected of {result.get('element_count', 0)}"
        detail += f", e.g. {examples[:5]}" if examples else ""
    else:
        detail = f"observed {observed!r}"
    return Check(
        "expectation",
        outcome.rule.type,
        column,
        outcome.success,
        observed,
        outcome.rule.kwargs,
        f"{outcome.rule.type}({column or ''}): {detail}",
    )
