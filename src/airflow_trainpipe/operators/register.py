"""RegisterModelOperator: the `register` task, the promoted candidate into the MLflow registry.

With `register.approval: required` the version only gets `register.staging_alias` here; the
`approve` and `promote` tasks (operators/approval.py, operators/promote.py) do the rest.

Idempotent: the version for an MLflow run is looked up by run id before one is created, so a
retry of this task or a re-run of the DAG run finds the version the first attempt created
instead of adding a second one. Promotion moves aliases (`register.alias`, default `champion`;
the replaced version gets `register.previous_alias`), never the deprecated stages.
"""

from __future__ import annotations

import json
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

    from airflow_trainpipe.contracts.payloads import GateDecision

# Run tags of the training job copied onto the version (lineage); missing ones are skipped.
LINEAGE_RUN_TAGS = (
    "trainpipe.data_digest",
    "trainpipe.config_hash",
    "trainpipe.code_version",
    "trainpipe.world_size",
    "trainpipe.transform_hash",
    "trainpipe.data_window",
    "trainpipe.data_partitions",
    "trainpipe.data_missing",
    "trainpipe.data_source",
    "trainpipe.data_query_sha256",
    "trainpipe.data_table_version",
    "trainpipe.data_snapshot_id",
    "trainpipe.data_filter",
    "trainpipe.pretrained_uri",
    "trainpipe.pretrained_source",
    "trainpipe.pretrained_sha256",
    "trainpipe.feast_project",
    "trainpipe.feast_features",
    "trainpipe.feast_feature_views",
    "trainpipe.feast_definitions_sha256",
    "trainpipe.feast_entity_digest",
    "trainpipe.feast_entity_time",
    "trainpipe.threshold",
)


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
        lineage = {
            "trainpipe.pipeline": self.config.pipeline,
            "airflow.dag_id": self.dag_id,
            "airflow.dag_run_id": str(dag_run.run_id) if dag_run is not None else "",
        }
        self._lineage_tracking_uri = hook.tracking_uri
        result = register_candidate(hook, self.config, run_id, decision, lineage, log=self.log)
        self._lineage_registered = result
        MlflowModelVersionLink.persist(context, result["model_version_url"])
        return result


def register_candidate(
    hook: Any, config: PipelineConfig, run_id: str, decision: GateDecision, lineage: dict[str, str], log: Any
) -> dict[str, Any]:
    """Find or create the version of `run_id`, tag it, and move the aliases. Safe to repeat.

    With `register.approval: required` the version only gets the staging alias: the champion
    moves when a person approves (operators/promote.py); with a `canary` section it gets the
    canary's alias, and the champion moves when the canary's last step held (operators/canary.py)."""
    name = config.registered_model_name
    run = hook.finished_run(run_id)
    version, created = hook.find_or_create_version(name, run, f"trainpipe pipeline {config.pipeline}")
    if created:
        log.info("registered run %s as %s version %s", run_id, name, version)
    else:
        log.info("run %s is already registered as %s version %s: not creating another", run_id, name, version)
    hook.set_version_tags(name, version, version_tags(config, run, decision, lineage))
    result = {
        "model_name": name,
        "version": version,
        "created": created,
        "model_uri": f"models:/{name}/{version}",
        "mlflow_run_id": run_id,
        "data_digest": run.data.tags.get("trainpipe.data_digest"),
        "gate_reason": decision.reason,
        "model_version_url": hook.model_version_url(name, version),
    }
    if (staged := waiting_alias(config)) is not None:
        staging_alias, waits_for = staged
        hook.move_alias(name, staging_alias, version, None, None)
        log.info(
            "%s version %s is @%s: it waits for %s before it becomes @%s",
            name,
            version,
            staging_alias,
            waits_for,
            config.registration.alias,
        )
        return {
            **result,
            "alias": staging_alias,
            "promoted": False,
            "previous_version": None,
            "previous_alias": None,
        }
    return {**result, **promote_version(hook, config, version, decision, log, run_id)}


def waiting_alias(config: PipelineConfig) -> tuple[str, str] | None:
    """(the alias a registered version waits at, what it waits for), or None when register
    promotes at once: approval waits at `staging_alias`, a canary at `canary.alias`."""
    if config.registration.approval == "required":
        return config.registration.staging_alias, "approval"
    if config.canary is not None:
        return config.canary.alias, "its canary"
    return None


def check_champion_unchanged(
    hook: Any, config: PipelineConfig, version: str, decision: GateDecision
) -> str | None:
    """The version holding `register.alias` now; raises when it is neither `version` nor the one the
    gate compared against (unless forced): the comparison is stale, so nothing may move."""
    name, alias = config.registered_model_name, config.registration.alias
    holder = hook.current_champion(name, alias)
    holder_version = holder[0] if holder else None
    if holder_version not in (version, decision.champion_version) and not decision.forced:
        raise AirflowFailException(
            f"{name}@{alias} is version {holder_version or 'none'}, but the gate compared against "
            f"{decision.champion_version or 'none'}; the champion changed in between, so this version is not promoted"
        )
    return holder_version


def promote_version(
    hook: Any, config: PipelineConfig, version: str, decision: GateDecision, log: Any, run_id: str
) -> dict[str, Any]:
    """Move `register.alias` to `version` (trained by `run_id`), its feature views loaded online
    first; the version holding it gets `previous_alias`."""
    from airflow_trainpipe.registry.online_features import load_online

    name, alias, previous_alias = (
        config.registered_model_name,
        config.registration.alias,
        config.registration.previous_alias,
    )
    holder_version = check_champion_unchanged(hook, config, version, decision)
    load_online(hook, config, version, run_id, log)
    previous = None
    if holder_version == version:
        log.info("%s version %s already holds alias %r", name, version, alias)
    else:
        previous = hook.move_alias(name, alias, version, previous_alias, holder_version)
        log.info(
            "%s version %s is now @%s%s",
            name,
            version,
            alias,
            f"; version {previous} is @{previous_alias}" if previous else "",
        )
    return {
        "alias": alias,
        "promoted": True,
        "previous_version": previous,
        "previous_alias": previous_alias if previous else None,
    }


def version_tags(
    config: PipelineConfig, run: Any, decision: GateDecision, lineage: dict[str, str]
) -> dict[str, str]:
    """The lineage of a model version: the run's lineage tags, the DAG run, the gate's numbers."""
    from airflow_trainpipe import __version__

    compared = decision.champion_version
    run_tags = run.data.tags
    return {
        **config.registration.tags,
        **{key: run_tags[key] for key in LINEAGE_RUN_TAGS if key in run_tags},
        "trainpipe.config_hash": run_tags.get("trainpipe.config_hash", config.content_hash),
        "trainpipe.code_version": run_tags.get("trainpipe.code_version", __version__),
        **lineage,
        "trainpipe.mlflow_run_id": run.info.run_id,
        "trainpipe.champion_compared": f"{config.registered_model_name}/{compared}" if compared else "none",
        "trainpipe.gate.metric": decision.metric,
        "trainpipe.gate.candidate": str(decision.candidate),
        "trainpipe.gate.champion": str(decision.champion),
        "trainpipe.gate.improvement": str(decision.improvement),
        "trainpipe.gate.forced": str(decision.forced).lower(),
        "trainpipe.gate.reason": decision.reason[:5000],
        **(
            {
                "trainpipe.gate.confidence": str(decision.confidence),
                "trainpipe.gate.improvement_interval": json.dumps(list(decision.improvement_interval)),
            }
            if decision.confidence is not None and decision.improvement_interval is not None
            else {}
        ),
    }
