"""ModelApprovalOperator: the `approve` task, a person's yes or no before a version becomes champion.

Airflow's own human-in-the-loop `ApprovalOperator` does the waiting: the request appears in the
UI's Required Actions (and the HITL REST API), the task parks in `awaiting_input` without holding
a worker slot, and the scheduler applies `register.on_approval_timeout` when nobody answers. This
class only fills in what to decide on (the gate's verdict, both models' metrics, the report) and
records the answer on the model version, so the registry says who let a model through, or who
stopped it and why, without anyone reading Airflow's database.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import Param

from airflow_trainpipe.config import PipelineConfig, as_config
from airflow_trainpipe.config.types import short_duration
from airflow_trainpipe.contracts.tags import APPROVAL_TAG
from airflow_trainpipe.core.retry_policy import TrainpipeRetryPolicyMixin
from airflow_trainpipe.links.mlflow import GateReportLink, MlflowModelVersionLink

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_trainpipe.contracts.payloads import GateDecision

REASON_PARAM = "reason"
TIMED_OUT_BY = "timeout"


class ModelApprovalOperator(TrainpipeRetryPolicyMixin, ApprovalOperator):
    """Ask for approval of the version the `register` task staged; record the answer on it.

    Approve: downstream `promote` moves the champion. Reject (or a timeout that rejects): the
    version is tagged `trainpipe.rejected_*`, loses the staging alias, and downstream is skipped.

    :param config: the parsed pipeline config, or the path of its YAML file.
    :param register_task_id: task whose XCom is the staged version (RegisterModelOperator's result).
    :param gate_task_id: task whose XCom is the gate's decision.
    :param train_task_id: task whose XCom holds both models' metrics (TrainResult).
    :param mlflow_conn_id: `mlflow` connection; undefined `mlflow_default`: the embedded store.
    """

    template_fields: Sequence[str] = ("subject", "body")
    ui_color = "#fadbd8"
    operator_extra_links = (GateReportLink(), MlflowModelVersionLink())

    def __init__(
        self,
        *,
        config: PipelineConfig | str,
        register_task_id: str = "register",
        gate_task_id: str = "gate",
        train_task_id: str = "train",
        mlflow_conn_id: str | None = "mlflow_default",
        **kwargs: Any,
    ) -> None:
        config = as_config(config)
        section = config.registration
        defaults = {"reject": ApprovalOperator.REJECT, "approve": ApprovalOperator.APPROVE}.get(
            section.on_approval_timeout
        )
        kwargs.setdefault("subject", f"Promote a {config.registered_model_name} version to @{section.alias}?")
        kwargs.setdefault(
            "params",
            {
                REASON_PARAM: Param(
                    "",
                    type="string",
                    title="Reason",
                    description="Why: recorded on the model version with your name.",
                )
            },
        )
        super().__init__(
            defaults=defaults,
            response_timeout=section.approval_timeout,
            assigned_users=[{"id": user, "name": user} for user in section.approvers] or None,
            **kwargs,
        )
        self.config = config
        self.register_task_id = register_task_id
        self.gate_task_id = gate_task_id
        self.train_task_id = train_task_id
        self.mlflow_conn_id = mlflow_conn_id

    def execute(self, context: Context) -> Any:
        from airflow_trainpipe.contracts.payloads import GateDecision, read_payload

        ti = context["ti"]
        staged = ti.xcom_pull(task_ids=self.register_task_id) or {}
        decision = read_payload(
            GateDecision, ti.xcom_pull(task_ids=self.gate_task_id), f"the XCom of task {self.gate_task_id!r}"
        )
        report_url = ti.xcom_pull(task_ids=self.gate_task_id, key=GateReportLink().xcom_key)
        metrics = self._metrics(ti)
        name, version = staged.get("model_name"), staged.get("version")
        alias = self.config.registration.alias
        self.subject = f"Promote {name} version {version} to @{alias}?"
        self.body = approval_body(decision, staged, metrics, report_url, self.config)
        GateReportLink.persist(context, report_url)
        MlflowModelVersionLink.persist(context, staged.get("model_version_url"))
        return super().execute(context)

    def _metrics(self, ti: Any) -> tuple[dict[str, float], dict[str, float] | None]:
        from airflow_trainpipe.contracts.payloads import TrainResult

        raw = ti.xcom_pull(task_ids=self.train_task_id)
        if raw is None:  # a gate on a named MLflow run: no train task to read the metrics from
            return {}, None
        evaluation, _ = TrainResult.model_validate(raw).candidate(f"the XCom of task {self.train_task_id!r}")
        return dict(evaluation.candidate), (dict(evaluation.champion) if evaluation.champion else None)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        if "error" not in event:
            self._record(context, event)
        return super().execute_complete(context=context, event=event)

    def _record(self, context: Context, event: dict[str, Any]) -> None:
        """The answer onto the version: who, when, why; a rejected version loses the staging alias."""
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.registry.aliases import audit_tags, release_alias

        staged = context["ti"].xcom_pull(task_ids=self.register_task_id) or {}
        name, version = staged["model_name"], staged["version"]
        approved = event["chosen_options"] == [self.APPROVE]
        action = "approved" if approved else "rejected"
        user = event.get("responded_by_user")
        timed_out = bool(event.get("timedout")) or not user
        actor = TIMED_OUT_BY if timed_out else answered_by(user)
        reason = str((event.get("params_input") or {}).get(REASON_PARAM) or "")
        if timed_out:
            reason = (
                f"no answer within {short_duration(self.config.registration.approval_timeout)}; "
                f"register.on_approval_timeout is {self.config.registration.on_approval_timeout}"
            )
        hook = MlflowHook(self.mlflow_conn_id)
        hook.set_version_tags(name, version, {**audit_tags(action, actor, reason), APPROVAL_TAG: action})
        if not approved:
            release_alias(hook, name, self.config.registration.staging_alias, version)
        self.log.info(
            "%s version %s %s by %s: %s", name, version, action, actor, reason or "(no reason given)"
        )


def answered_by(user: dict[str, Any] | None) -> str:
    """Who answered, as recorded on the version: the Airflow user, or `timeout` for the default."""
    return str(user.get("name") or user.get("id")) if user else TIMED_OUT_BY


def approval_body(
    decision: GateDecision,
    staged: dict[str, Any],
    metrics: tuple[dict[str, float], dict[str, float] | None],
    report_url: str | None,
    config: PipelineConfig,
) -> str:
    """The Markdown the Required Actions page shows: the verdict, the numbers, where to look."""
    name, version = staged.get("model_name"), staged.get("version")
    champion = f"version {decision.champion_version}" if decision.champion_version else "none yet"
    lines = [
        f"**{name} version {version}** passed the gate and waits at "
        f"`@{config.registration.staging_alias}`; the champion is {champion}.",
        "",
        f"**Gate:** {decision.reason}",
        "",
        f"Primary metric `{decision.metric}` ({decision.direction}): candidate {_number(decision.candidate)}, "
        f"champion {_number(decision.champion)}"
        + (f", improvement {_number(decision.improvement)}" if decision.improvement is not None else "")
        + (
            f" ({decision.confidence:.0%} interval {_number(decision.improvement_interval[0])} .. "
            f"{_number(decision.improvement_interval[1])})"
            if decision.confidence is not None and decision.improvement_interval is not None
            else ""
        ),
        "",
    ]
    candidate, champion_metrics = metrics
    if candidate:
        lines += ["| metric | candidate | champion |", "|---|---|---|"]
        for metric in sorted(candidate, key=lambda m: (m != decision.metric, m)):
            theirs = champion_metrics.get(metric) if champion_metrics else None
            lines.append(f"| {metric} | {_number(candidate[metric])} | {_number(theirs)} |")
        lines.append("")
    links = [("Gate report", report_url), ("Model version", staged.get("model_version_url"))]
    lines += [" · ".join(f"[{label}]({url})" for label, url in links if url)]
    on_timeout = config.registration.on_approval_timeout
    lines += [
        "",
        f"Approve makes it `@{config.registration.alias}`; Reject keeps the champion. Without an answer "
        f"within {short_duration(config.registration.approval_timeout)}: {on_timeout}.",
    ]
    return "\n".join(lines).strip()


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"
