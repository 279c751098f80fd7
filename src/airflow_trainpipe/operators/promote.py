"""PromoteModelOperator: the `promote` task, the approved version becomes the champion.

Runs only after `approve` said yes (a rejection skips it). It reads the staged version, the
answer and the gate's decision, and calls `registry.versions.promote_approved`: the aliases move
through `aliases.promote`, the code `trainpipe promote` uses, so a version promoted by approval
carries the same `promoted_*` audit tags as one promoted by hand; and, as the register task does
without approval, nothing moves when the champion changed since the gate compared against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_trainpipe.config import PipelineConfig, as_config
from airflow_trainpipe.core.retry_policy import TrainpipeRetryPolicyMixin
from airflow_trainpipe.links.mlflow import MlflowModelVersionLink
from airflow_trainpipe.openlineage.reporting import ModelVersionReporting

if TYPE_CHECKING:
    from airflow.sdk import Context


class PromoteModelOperator(TrainpipeRetryPolicyMixin, ModelVersionReporting, BaseOperator):
    """Move `register.alias` to the approved version; the one it replaces gets `previous_alias`.

    :param config: the parsed pipeline config, or the path of its YAML file.
    :param register_task_id: task whose XCom is the staged version.
    :param approval_task_id: task whose XCom is the approval (chosen option, who, the reason).
    :param gate_task_id: task whose XCom is the gate's decision.
    :param mlflow_conn_id: `mlflow` connection; undefined `mlflow_default`: the embedded store.
    """

    template_fields: Sequence[str] = ()
    ui_color = "#d5f5e3"
    operator_extra_links = (MlflowModelVersionLink(),)

    def __init__(
        self,
        *,
        config: PipelineConfig | str,
        register_task_id: str = "register",
        approval_task_id: str = "approve",
        gate_task_id: str = "gate",
        mlflow_conn_id: str | None = "mlflow_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config = as_config(config)
        self.register_task_id = register_task_id
        self.approval_task_id = approval_task_id
        self.gate_task_id = gate_task_id
        self.mlflow_conn_id = mlflow_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from airflow_trainpipe.contracts.payloads import GateDecision, read_payload
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.operators.approval import REASON_PARAM, answered_by
        from airflow_trainpipe.registry.versions import ChampionChanged, promote_approved

        ti = context["ti"]
        staged = ti.xcom_pull(task_ids=self.register_task_id) or {}
        answer = ti.xcom_pull(task_ids=self.approval_task_id) or {}
        if answer.get("chosen_options") != ["Approve"]:
            raise AirflowFailException(
                f"task {self.approval_task_id!r} did not approve (answer: {answer.get('chosen_options')})"
            )
        decision = read_payload(
            GateDecision, ti.xcom_pull(task_ids=self.gate_task_id), f"the XCom of task {self.gate_task_id!r}"
        )
        user = answer.get("responded_by_user")
        actor = answered_by(user)
        reason = str((answer.get("params_input") or {}).get(REASON_PARAM) or "") or (
            "approved" if user else "no answer in time; register.on_approval_timeout is approve"
        )
        hook = MlflowHook(self.mlflow_conn_id)
        version = (staged["model_name"], staged["version"], staged["mlflow_run_id"])
        try:
            move = promote_approved(hook, self.config, version, decision, (actor, reason), self.log)
        except ChampionChanged as exc:  # a stale comparison: no retry can make it fresh
            raise AirflowFailException(str(exc)) from exc
        self.log.info("%s (approved by %s)", move.describe(), actor)
        MlflowModelVersionLink.persist(context, staged.get("model_version_url"))
        promoted = {
            **staged,
            "alias": move.alias,
            "promoted": True,
            "previous_version": move.replaced,
            "previous_alias": move.previous_alias,
            "approved_by": actor,
        }
        self._lineage_registered, self._lineage_tracking_uri = promoted, hook.tracking_uri
        return promoted
