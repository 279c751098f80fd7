"""Schema contract and volume checks: answered from the manifest alone, before any data is read."""

from __future__ import annotations

from typing import Any

from airflow_trainpipe.config.pipeline import PipelineConfig
from airflow_trainpipe.contracts.payloads import Check

TEXT_TYPES = ("string", "large_string")
"""Arrow types a text column may have (`data.features.text`)."""


def required_columns(config: PipelineConfig, reference: dict[str, Any] | None) -> dict[str, str | None]:
    """Column -> expected Arrow type (None: any). The contract when declared, else what the
    model uses, typed like the reference snapshot."""
    if config.validation.contract.columns:
        return dict(config.validation.contract.columns)
    used = [
        config.data.label,
        *config.data.features.all,
        *filter(None, [config.data.holdout.key_column, config.data.group]),
    ]
    known = (reference or {}).get("columns", {})
    return {name: known.get(name) for name in used}


def schema_checks(
    config: PipelineConfig, columns: dict[str, str], reference: dict[str, Any] | None
) -> list[Check]:
    required = required_columns(config, reference)
    if config.validation.contract.columns:
        allowed: set[str] | None = set(required)
    else:
        allowed = set((reference or {}).get("columns", {})) or None  # no reference yet: anything goes
    extra = [c for c in columns if allowed is not None and c not in allowed]
    checks: list[Check] = []
    for name, expected in required.items():
        if (problem := _column_problem(config, name, expected, columns, extra)) is not None:
            checks.append(problem)
    if not config.validation.contract.allow_extra_columns:
        for name in extra:
            checks.append(
                Check(
                    "schema",
                    "unexpected column",
                    name,
                    False,
                    columns[name],
                    "absent",
                    f"column {name!r} is not in the contract (set validation.schema.allow_extra_columns to accept it)",
                )
            )
    if not checks:
        checks.append(
            Check(
                "schema",
                "contract",
                None,
                True,
                len(columns),
                len(required),
                f"{len(required)} required column(s) present with the expected types",
            )
        )
    return checks


def _column_problem(
    config: PipelineConfig, name: str, expected: str | None, columns: dict[str, str], extra: list[str]
) -> Check | None:
    """A required column that is missing, or of another type than expected (strings for text)."""
    if name not in columns:
        hint = f"; new column(s) {', '.join(map(repr, extra))}: renamed?" if extra else ""
        return Check(
            "schema", "column present", name, False, "missing", expected or "present",
            f"column {name!r} is missing{hint}",
        )  # fmt: skip
    if name in config.data.features.text and columns[name] not in TEXT_TYPES:
        return Check(
            "schema", "column type", name, False, columns[name], "string",
            f"text column {name!r} is {columns[name]}, expected strings",
        )  # fmt: skip
    if expected is not None and columns[name] != expected:
        return Check(
            "schema", "column type", name, False, columns[name], expected,
            f"column {name!r} is {columns[name]}, expected {expected}",
        )  # fmt: skip
    return None


def volume_checks(config: PipelineConfig, rows: int, previous: dict[str, Any] | None) -> list[Check]:
    rule = config.validation.volume
    checks = [
        Check(
            "volume",
            "min_rows",
            None,
            rows >= rule.min_rows,
            rows,
            f">= {rule.min_rows}",
            f"{rows} row(s); at least {rule.min_rows} expected",
        )
    ]
    if rule.max_change is not None:
        if previous is None:
            checks.append(
                Check(
                    "volume",
                    "max_change",
                    None,
                    True,
                    rows,
                    None,
                    "no previous validated snapshot to compare the row count with",
                )
            )
        else:
            before = previous["rows"]
            change = (rows - before) / before if before else float("inf")
            checks.append(
                Check(
                    "volume",
                    "max_change",
                    None,
                    abs(change) <= rule.max_change,
                    round(change, 6),
                    f"+/-{rule.max_change}",
                    f"{rows} row(s) vs {before} in {previous['partition']} ({change:+.1%}); allowed +/-{rule.max_change:.0%}",
                )
            )
    return checks
