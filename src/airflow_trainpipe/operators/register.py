"""RegisterModelOperator: the `register` task, the promoted candidate into the MLflow registry.

It reads the gate's decision, calls `registry.versions.register_candidate` and returns what that
registered. With `register.approval: required` the version only gets `register.staging_alias`
here; the `approve` and `promote` tasks (operators/approval.py, operators/promote.py) do the
rest. Registering is idempotent and moves aliases, never stages (registry/versions.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_trainpipe.config import PipelineConfig, as_config
from airflow_trainpipe.core.retry_policy import TrainpipeRetryPolicyMixin
from airflow_trainpipe.links.mlflow import MlflowModelVersionLink
from airflow_trainpipe.openlineage.reporting import ModelVersionReporting

if TYPE_CHECKING:
    from airflow.sdk import Context


class RegisterModelOperator(TrainpipeRetryPolicyMixin, ModelVersionReporting, BaseOperator):
    """Register the candidate run's model, tag its lineage, and make it the champion.

    :param config: the parsed pipeline config, or the path of its YAML file.
    :param mlflow_run_id: the candidate's MLflow run (templated); default: the gate's decision.
    :param gate_decision: the gate's decision (a GateDecision dict, e.g. `gate.output`); default:
        the XCom of `gate_task_id`.
    :param gate_task_id: task whose XCom holds the gate's decision.
    :param mlflow_conn_id: `mlflow` connection; undefined `mlflow_default`: the embedded store.
    """

    template_fields: Sequence[str] = ("mlflow_run_id", "gate_decision")
    template_fields_renderers = {"gate_decision": "json"}
    ui_color = "#d5f5e3"
    operator_extra_links = (MlflowModelVersionLink(),)

    def __init__(
        self,
        *,
        config: PipelineConfig | str,
        mlflow_run_id: str | None = None,
        gate_decision: dict[str, Any] | None = None,
        gate_task_id: str = "gate",
        mlflow_conn_id: str | None = "mlflow_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config = as_config(config)
        self.mlflow_run_id = mlflow_run_id
        self.gate_decision = gate_decision
        self.gate_task_id = gate_task_id
        self.mlflow_conn_id = mlflow_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_trainpipe.contracts.payloads import GateDecision, read_payload
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.registry.versions import ChampionChanged, dag_run_lineage, register_candidate

        hook = MlflowHook(self.mlflow_conn_id)
        raw = (
            self.gate_decision
            if self.gate_decision is not None
            else context["ti"].xcom_pull(task_ids=self.gate_task_id)
        )
        source = (
            "gate_decision" if self.gate_decision is not None else f"the XCom of task {self.gate_task_id!r}"
        )
        decision = read_payload(GateDecision, raw, source)
        if not decision.promote:
            raise AirflowFailException(f"the gate did not promote this candidate: {decision.reason}")
        run_id = str(self.mlflow_run_id or decision.mlflow_run_id or "")
        if not run_id:
            raise AirflowFailException(
                "no MLflow run id: pass mlflow_run_id or a gate decision that names it"
            )
        dag_run = context.get("dag_run")
        lineage = dag_run_lineage(
            self.config.pipeline, self.dag_id, str(dag_run.run_id) if dag_run is not None else ""
        )
        self._lineage_tracking_uri = hook.tracking_uri
        try:
            result = register_candidate(hook, self.config, run_id, decision, lineage, log=self.log)
        except ChampionChanged as exc:  # a stale comparison: no retry can make it fresh
            raise AirflowFailException(str(exc)) from exc
        self._lineage_registered = result
        MlflowModelVersionLink.persist(context, result["model_version_url"])
        return result
