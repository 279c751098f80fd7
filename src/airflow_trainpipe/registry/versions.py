"""A candidate's model version in the MLflow registry: registered, tagged, staged or promoted, and
what a canary's promotion records on it (the other records: registry/records.py). The register,
promote and canary tasks call these; their operators read their payloads, call one function here
and write a payload.

Idempotent: the version of an MLflow run is looked up by run id before one is created, so a retry
of the register task or a re-run of the DAG run finds the version the first attempt created
instead of adding a second one. Promotion moves aliases (`register.alias`, default `champion`;
the replaced version gets `register.previous_alias`), never the deprecated stages; by hand
(`trainpipe promote | rollback`) and after approval they move through registry/aliases.py, so
both record who moved them. Nothing moves when the champion changed since the gate compared
against it (`ChampionChanged`): that comparison is stale.

Every tag name comes from contracts/tags.py; this module holds no Airflow import, so the tasks
translate `ChampionChanged` into a task failure themselves.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.contracts.tags import (
    AIRFLOW_DAG_ID_TAG,
    AIRFLOW_DAG_RUN_ID_TAG,
    CANARY_RESULT_TAG,
    CHAMPION_COMPARED_TAG,
    CODE_VERSION_TAG,
    CONFIG_HASH_TAG,
    DATA_DIGEST_TAG,
    GATE_CANDIDATE_TAG,
    GATE_CHAMPION_TAG,
    GATE_CONFIDENCE_TAG,
    GATE_FORCED_TAG,
    GATE_IMPROVEMENT_INTERVAL_TAG,
    GATE_IMPROVEMENT_TAG,
    GATE_METRIC_TAG,
    GATE_REASON_TAG,
    LINEAGE_RUN_TAGS,
    MLFLOW_RUN_ID_TAG,
    PIPELINE_TAG,
)
from airflow_trainpipe.registry.reads import RegistryError, current_champion, finished_run

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.contracts.payloads import GateDecision
    from airflow_trainpipe.hooks.mlflow import MlflowHook
    from airflow_trainpipe.registry.aliases import AliasMove


class ChampionChanged(RegistryError):
    """`register.alias` is held by neither the version nor the one the gate compared against."""


def dag_run_lineage(pipeline: str, dag_id: str, dag_run_id: str) -> dict[str, str]:
    """The version tags that name the pipeline and the DAG run that registered it."""
    return {PIPELINE_TAG: pipeline, AIRFLOW_DAG_ID_TAG: dag_id, AIRFLOW_DAG_RUN_ID_TAG: dag_run_id}


def register_candidate(
    hook: MlflowHook,
    config: PipelineConfig,
    run_id: str,
    decision: GateDecision,
    lineage: dict[str, str],
    log: Any,
) -> dict[str, Any]:
    """Find or create the version of `run_id`, tag it, and move the aliases. Safe to repeat.

    With `register.approval: required` the version only gets the staging alias: the champion
    moves when a person approves (`promote_approved`); with a `canary` section it gets the
    canary's alias, and the champion moves when the canary's last step held (`promote_after_canary`)."""
    name = config.registered_model_name
    run = hook.call(finished_run, run_id)
    version, created = hook.call(find_or_create_version, name, run, f"trainpipe pipeline {config.pipeline}")
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
        "data_digest": run.data.tags.get(DATA_DIGEST_TAG),
        "gate_reason": decision.reason,
        "model_version_url": hook.model_version_url(name, version),
    }
    if (staged := waiting_alias(config)) is not None:
        staging_alias, waits_for = staged
        stage_version(hook, name, staging_alias, version)
        log.info(
            "%s version %s is @%s: it waits for %s before it becomes @%s",
            name, version, staging_alias, waits_for, config.registration.alias,
        )  # fmt: skip
        return {
            **result,
            "alias": staging_alias,
            "promoted": False,
            "previous_version": None,
            "previous_alias": None,
        }
    return {**result, **promote_version(hook, config, version, decision, log, run_id)}


def find_or_create_version(
    client: MlflowClient, model_name: str, run: Any, description: str
) -> tuple[str, bool]:
    """The model version of `run` (created when there is none yet): (version, created).

    Looked up by run id first, so a retry or a re-run never registers a second version."""
    from mlflow.exceptions import MlflowException

    run_id = run.info.run_id
    try:
        client.create_registered_model(model_name, description=description)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    existing = client.search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
    if existing:
        return str(min(existing, key=lambda v: int(v.version)).version), False
    outputs = run.outputs.model_outputs if run.outputs else []
    if not outputs:
        raise RegistryError(f"MLflow run {run_id} logged no model to register")
    model_id = outputs[-1].model_id
    version = client.create_model_version(
        name=model_name, source=f"models:/{model_id}", run_id=run_id, model_id=model_id
    )
    return str(version.version), True


def waiting_alias(config: PipelineConfig) -> tuple[str, str] | None:
    """(the alias a registered version waits at, what it waits for), or None when register
    promotes at once: approval waits at `staging_alias`, a canary at `canary.alias`."""
    if config.registration.approval == "required":
        return config.registration.staging_alias, "approval"
    if config.canary is not None:
        return config.canary.alias, "its canary"
    return None


def stage_version(hook: MlflowHook, model_name: str, alias: str, version: str) -> None:
    """`version` gets `alias` (a staging or canary alias); no other alias moves."""
    hook.move_alias(model_name, alias, version, None, None)


def check_champion_unchanged(
    hook: MlflowHook, config: PipelineConfig, version: str, decision: GateDecision
) -> str | None:
    """The version holding `register.alias` now; ChampionChanged when it is neither `version` nor
    the one the gate compared against (unless forced): the comparison is stale, so nothing may move."""
    name, alias = config.registered_model_name, config.registration.alias
    holder = hook.call(current_champion, name, alias)
    holder_version = holder[0] if holder else None
    if holder_version not in (version, decision.champion_version) and not decision.forced:
        raise ChampionChanged(
            f"{name}@{alias} is version {holder_version or 'none'}, but the gate compared against "
            f"{decision.champion_version or 'none'}; the champion changed in between, so this version is not promoted"
        )
    return holder_version


def promote_version(
    hook: MlflowHook, config: PipelineConfig, version: str, decision: GateDecision, log: Any, run_id: str
) -> dict[str, Any]:
    """Move `register.alias` to `version` (trained by `run_id`), its feature views loaded online
    first; the version holding it gets `previous_alias`."""
    from airflow_trainpipe.registry.online_features import load_online

    name, alias = config.registered_model_name, config.registration.alias
    previous_alias = config.registration.previous_alias
    holder_version = check_champion_unchanged(hook, config, version, decision)
    load_online(hook, config, version, run_id, log)
    previous = None
    if holder_version == version:
        log.info("%s version %s already holds alias %r", name, version, alias)
    else:
        previous = hook.move_alias(name, alias, version, previous_alias, holder_version)
        where = f"; version {previous} is @{previous_alias}" if previous else ""
        log.info("%s version %s is now @%s%s", name, version, alias, where)
    return {
        "alias": alias,
        "promoted": True,
        "previous_version": previous,
        "previous_alias": previous_alias if previous else None,
    }


def promote_approved(
    hook: MlflowHook,
    config: PipelineConfig,
    staged: tuple[str, str, str],
    decision: GateDecision,
    approval: tuple[str, str],
    log: Any,
) -> AliasMove:
    """The approved version becomes `register.alias` as `trainpipe promote` makes it, recording who
    approved and why (`approval`: actor, reason), its feature views loaded online first; it leaves
    the staging alias. `staged`: (model name, version, run id) as the register task staged it."""
    from airflow_trainpipe.registry.aliases import promote, release_alias
    from airflow_trainpipe.registry.online_features import load_online

    section, (name, version, run_id), (actor, reason) = config.registration, staged, approval
    check_champion_unchanged(hook, config, version, decision)
    load_online(hook, config, version, run_id, log)
    move = promote(
        hook,
        name,
        version,
        actor=actor,
        reason=reason,
        alias=section.alias,
        previous_alias=section.previous_alias,
    )
    release_alias(hook, name, section.staging_alias, version)
    return move


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
        CONFIG_HASH_TAG: run_tags.get(CONFIG_HASH_TAG, config.content_hash),
        CODE_VERSION_TAG: run_tags.get(CODE_VERSION_TAG, __version__),
        **lineage,
        MLFLOW_RUN_ID_TAG: run.info.run_id,
        CHAMPION_COMPARED_TAG: f"{config.registered_model_name}/{compared}" if compared else "none",
        GATE_METRIC_TAG: decision.metric,
        GATE_CANDIDATE_TAG: str(decision.candidate),
        GATE_CHAMPION_TAG: str(decision.champion),
        GATE_IMPROVEMENT_TAG: str(decision.improvement),
        GATE_FORCED_TAG: str(decision.forced).lower(),
        GATE_REASON_TAG: decision.reason[:5000],
        **(
            {
                GATE_CONFIDENCE_TAG: str(decision.confidence),
                GATE_IMPROVEMENT_INTERVAL_TAG: json.dumps(list(decision.improvement_interval)),
            }
            if decision.confidence is not None and decision.improvement_interval is not None
            else {}
        ),
    }


def promote_after_canary(
    hook: MlflowHook,
    config: PipelineConfig,
    staged: tuple[str, str, str],
    decision: GateDecision,
    log: Any,
    canaried: bool,
) -> dict[str, Any]:
    """`promote_version` once the canary held (`canaried`) or had no champion to run against; the
    version records which, and leaves the canary and staging aliases. `staged`: (model name,
    version, run id) as the register task staged it."""
    from airflow_trainpipe.registry.aliases import release_alias

    name, version, run_id = staged
    moved = promote_version(hook, config, version, decision, log, run_id)
    hook.set_version_tags(name, version, {CANARY_RESULT_TAG: "promoted" if canaried else "no_champion"})
    for alias in (canary_alias(config), config.registration.staging_alias):
        release_alias(hook, name, alias, version)
    return moved


def canary_alias(config: PipelineConfig) -> str:
    """The alias a version waits at while its canary runs (the config's `canary.alias`)."""
    if config.canary is None:
        raise ValueError(f"pipeline {config.pipeline} has no canary section")
    return config.canary.alias
