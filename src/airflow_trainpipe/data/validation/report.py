"""The result of validating one snapshot, whichever engine ran the checks: every check, the drift
profiles, and the summaries the task logs and the e-mail quotes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from airflow_trainpipe.contracts.manifest import Manifest
from airflow_trainpipe.contracts.payloads import Check


@dataclass
class ValidationReport:
    pipeline: str
    partition: str
    manifest: Manifest
    reference: dict[str, Any] | None
    checks: list[Check] = field(default_factory=list)
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    data_docs_html: str | None = None

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def drift_scores(self) -> dict[str, float]:
        return {c.column: c.observed for c in self.checks if c.kind == "drift" and c.column}

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "partition": self.partition,
            "partition_uri": self.manifest.partition_uri,
            "digest": self.manifest.digest,
            "rows": self.manifest.rows,
            "passed": self.passed,
            "reference": self.reference,
            "checks": [c.to_dict() for c in self.checks],
            "drift": self.drift_scores,
        }

    def failure_table(self) -> str:
        rows = [("check", "column", "observed", "expected", "message")]
        rows += [
            (f"{c.kind}:{c.name}", c.column or "-", _short(c.observed), _short(c.expected), c.message)
            for c in self.failures
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        return "\n".join("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows)

    def failure_summary(self) -> str:
        by_kind: dict[str, list[str]] = {}
        for check in self.failures:
            by_kind.setdefault(check.kind, []).append(f"{check.column}" if check.column else check.name)
        return "; ".join(f"{kind}: {', '.join(dict.fromkeys(names))}" for kind, names in by_kind.items())


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."
