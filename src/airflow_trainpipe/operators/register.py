"""RegisterModelOperator: the `register` task, the promoted candidate into the MLflow registry.

Idempotent: the version for an MLflow run is looked up by run id before one is created, so a
retry of this task or a re-run of the DAG run finds the version the first attempt created
instead of adding a second one. Promotion moves aliases (`register.alias`, default `champion`;
the replaced version gets `register.previous_alias`), never the deprecated stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_trainpipe.config import PipelineConfig, load_config
from airflow_trainpipe.links.mlflow import MlflowModelVersionLink

if TYPE_CHECKING:
    from airflow.sdk import Context

# Run tags of the training job copied onto the version (lineage); missing ones are skipped.
LINEAGE_RUN_TAGS = ("trainpipe.data_digest", "trainpipe.config_hash", "trainpipe.code_version", "trainpipe.world_size",
                    "trainpipe.transform_hash")


class RegisterModelOperator(BaseOperator):
    """Register the candidate run's model, tag its lineage, and make it the champion.

    :param config: the parsed pipeline config, or the path of its YAML file.
    :param mlflow_run_id: the candidate's MLflow run (templated); default: the gate's decision.
    :param gate_decision: the gate's decision dict (e.g. `gate.output`); default: the XCom of
        `gate_task_id`.
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
        self.config = config if isinstance(config, PipelineConfig) else load_config(config)
        self.mlflow_run_id = mlflow_run_id
        self.gate_decision = gate_decision
        self.gate_task_id = gate_task_id
        self.mlflow_conn_id = mlflow_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_trainpipe.hooks.mlflow import MlflowHook

        decision = self.gate_decision if self.gate_decision is not None else context["ti"].xcom_pull(task_ids=self.gate_task_id)
        if not isinstance(decision, dict) or "promote" not in decision:
            raise AirflowFailException(f"no gate decision (XCom of task {self.gate_task_id!r}); pass gate_decision")
        if not decision["promote"]:
            raise AirflowFailException(f"the gate did not promote this candidate: {decision.get('reason')}")
        run_id = str(self.mlflow_run_id or decision.get("mlflow_run_id") or "")
        if not run_id:
            raise AirflowFailException("no MLflow run id: pass mlflow_run_id or a gate decision that names it")
        hook = MlflowHook(self.mlflow_conn_id)
        dag_run = context.get("dag_run")
        lineage = {
            "trainpipe.pipeline": self.config.pipeline,
            "airflow.dag_id": self.dag_id,
            "airflow.dag_run_id": str(dag_run.run_id) if dag_run is not None else "",
        }
        with hook.activated():
            result = register(hook.get_conn(), self.config, run_id, decision, lineage, log=self.log)
        MlflowModelVersionLink.persist(context, hook.model_version_url(result["model_name"], result["version"]))
        return result


def register(client: Any, config: PipelineConfig, run_id: str, decision: dict[str, Any], lineage: dict[str, str], log: Any) -> dict[str, Any]:
    """Find or create the version of `run_id`, tag it, and move the aliases. Safe to repeat."""
    from mlflow.exceptions import MlflowException

    from airflow_trainpipe import __version__
    from airflow_trainpipe.operators.gate import candidate_run
    from airflow_trainpipe.registry import current_champion

    name, alias, previous_alias = config.registered_model_name, config.registration.alias, config.registration.previous_alias
    run = candidate_run(client, run_id)
    try:
        client.create_registered_model(name, description=f"trainpipe pipeline {config.pipeline}")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise

    existing = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    created = not existing
    if existing:
        version = min(existing, key=lambda v: int(v.version))
        log.info("run %s is already registered as %s version %s: not creating another", run_id, name, version.version)
    else:
        outputs = run.outputs.model_outputs if run.outputs else []
        if not outputs:
            raise AirflowFailException(f"MLflow run {run_id} logged no model to register")
        model_id = outputs[-1].model_id
        version = client.create_model_version(name=name, source=f"models:/{model_id}", run_id=run_id, model_id=model_id)
        log.info("registered run %s as %s version %s", run_id, name, version.version)

    compared = decision.get("champion_version")
    tags = {
        **config.registration.tags,
        **{key: run.data.tags[key] for key in LINEAGE_RUN_TAGS if key in run.data.tags},
        "trainpipe.config_hash": run.data.tags.get("trainpipe.config_hash", config.content_hash),
        "trainpipe.code_version": run.data.tags.get("trainpipe.code_version", __version__),
        **lineage,
        "trainpipe.mlflow_run_id": run_id,
        "trainpipe.champion_compared": f"{name}/{compared}" if compared else "none",
        "trainpipe.gate.metric": str(decision.get("metric")),
        "trainpipe.gate.candidate": str(decision.get("candidate")),
        "trainpipe.gate.champion": str(decision.get("champion")),
        "trainpipe.gate.improvement": str(decision.get("improvement")),
        "trainpipe.gate.forced": str(bool(decision.get("forced"))).lower(),
        "trainpipe.gate.reason": str(decision.get("reason"))[:5000],
    }
    for key, value in tags.items():
        client.set_model_version_tag(name, version.version, key, value)

    number = str(version.version)
    holder = current_champion(client, name, alias)
    holder_version = holder[0] if holder else None
    previous = None
    if holder_version == number:
        log.info("%s version %s already holds alias %r", name, number, alias)
    else:
        if holder_version != compared and not decision.get("forced"):
            raise AirflowFailException(
                f"{name}@{alias} is version {holder_version or 'none'}, but the gate compared against "
                f"{compared or 'none'}; the champion changed in between, so this version is not promoted"
            )
        if holder_version and previous_alias:
            client.set_registered_model_alias(name, previous_alias, holder_version)
            previous = holder_version
        client.set_registered_model_alias(name, alias, number)
        log.info("%s version %s is now @%s%s", name, number, alias,
                 f"; version {previous} is @{previous_alias}" if previous else "")
    return {
        "model_name": name,
        "version": number,
        "alias": alias,
        "created": created,
        "previous_version": previous,
        "previous_alias": previous_alias if previous else None,
        "model_uri": f"models:/{name}/{number}",
        "mlflow_run_id": run_id,
    }
