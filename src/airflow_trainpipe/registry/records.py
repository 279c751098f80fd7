"""What the gate and the canary record on MLflow: the gate's decision on the candidate's run (tags,
the decision, its chart and HTML report), and a canary's rollback and report on the version.

Written by the gate and canary tasks; read back by people (the reports, linked from the tasks) and
by the register task, which copies the gate's numbers onto the version (registry/versions.py).
Tag names come from contracts/tags.py.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.contracts.tags import (
    CANARY_FAILED_STEP_TAG,
    CANARY_FAILED_TAG,
    CANARY_FIGURES_TAG,
    CANARY_REPORT_TAG,
    CANARY_RESULT_TAG,
    CANARY_STEP_TAG_PREFIX,
    GATE_FORCED_TAG,
    GATE_PROMOTE_TAG,
    GATE_REASON_TAG,
)

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.contracts.payloads import GateDecision
    from airflow_trainpipe.hooks.mlflow import MlflowHook


def record_gate_decision(
    hook: MlflowHook, run_id: str, decision: GateDecision, figure: Any, report: str
) -> str | None:
    """The decision as an artifact and tags of the candidate's run, with its chart and its
    HTML report (registry/gate_report.py); returns the report's URL in MLflow's UI, if it has one."""
    from airflow_trainpipe.contracts.artifacts import (
        GATE_CHART_ARTIFACT,
        GATE_DECISION_ARTIFACT,
        GATE_REPORT_ARTIFACT,
    )

    with hook.activated():
        client = hook.get_conn()
        client.log_dict(run_id, decision.as_dict(), GATE_DECISION_ARTIFACT)
        client.set_tag(run_id, GATE_PROMOTE_TAG, str(decision.promote).lower())
        client.set_tag(run_id, GATE_FORCED_TAG, str(decision.forced).lower())
        client.set_tag(run_id, GATE_REASON_TAG, decision.reason[:5000])
        client.log_figure(run_id, figure, GATE_CHART_ARTIFACT)
    return hook.log_page(run_id, report, GATE_REPORT_ARTIFACT)


def record_canary_rollback(
    hook: MlflowHook,
    config: PipelineConfig,
    version: str,
    step: int,
    reason: str,
    figures: dict[str, Any],
    actor: str,
) -> None:
    """A failed canary step on the version (what failed, its figures, who rolled it back); the
    version leaves the canary alias. The traffic is the serving side's to move back first."""
    from airflow_trainpipe.registry.aliases import audit_tags, release_alias
    from airflow_trainpipe.registry.versions import canary_alias

    name = config.registered_model_name
    tags = {
        CANARY_RESULT_TAG: "rolled_back",
        CANARY_FAILED_STEP_TAG: str(step),
        CANARY_FAILED_TAG: reason[:5000],
        CANARY_FIGURES_TAG: json.dumps(figures)[:5000],
        **audit_tags("canary_rolled_back", actor, reason[:5000]),
    }
    hook.set_version_tags(name, version, tags)
    release_alias(hook, name, canary_alias(config), version)


def record_canary_step(
    hook: MlflowHook, model_name: str, version: str, step: int, checks: list[dict[str, Any]]
) -> None:
    """How sure a step was, on the version: each check's interval and the count it decided on."""
    compact = {c["check"]: {k: v for k, v in c.items() if k != "check"} for c in checks}
    hook.set_version_tags(
        model_name, version, {f"{CANARY_STEP_TAG_PREFIX}{step}": json.dumps(compact)[:5000]}
    )


def record_canary_report(hook: MlflowHook, model_name: str, version: str, page: str, path: str) -> str | None:
    """The canary's HTML report logged to the version's run as `path`, its URL (else its `runs:/`
    URI) on the version; returns the URL in MLflow's UI, None without one or without a run."""
    run_id = hook.model_version(model_name, version).run_id
    if not run_id:
        return None
    link = hook.log_page(run_id, page, path)
    hook.set_version_tags(model_name, version, {CANARY_REPORT_TAG: link or f"runs:/{run_id}/{path}"})
    return link
