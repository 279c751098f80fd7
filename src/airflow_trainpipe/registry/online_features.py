"""Online features for a promoted model: its feature views loaded into the online store first.

Called by the register task (no approval), the promote task (after approval), and `trainpipe
promote` / `rollback` before the champion alias moves, so a serving stack that follows the alias
never reads a model whose features are not online. The views and the time the training rows
covered come from the training run's lineage tags, so the model being promoted decides, not
today's config; by hand, the feature store's section comes from the config the run logged.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.contracts.tags import (
    FEAST_ENTITY_TIME_TAG,
    FEAST_FEATURE_VIEWS_TAG,
    FEAST_MATERIALIZED_UNTIL_TAG,
    FEAST_MATERIALIZED_VIEWS_TAG,
)
from airflow_trainpipe.registry.reads import finished_run

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig


def load_online(
    hook: Any, config: PipelineConfig, version: str, run_id: str, log: Any, model_name: str | None = None
) -> None:
    """`data.feature_store.materialize`: the views run `run_id` trained on loaded into the online
    store up to now, recorded on the model version (of `model_name`, by default the config's
    registered model); nothing without a feature store."""
    from airflow_trainpipe.data.feature_store import client
    from airflow_trainpipe.data.feature_store.join import repo_path
    from airflow_trainpipe.data.freeze import named_errors
    from airflow_trainpipe.data.sources.errors import SourceError

    section = config.data.feature_store
    if section is None or not section.materialize:
        return
    run_tags = hook.call(finished_run, run_id).data.tags
    views = [name for name in run_tags.get(FEAST_FEATURE_VIEWS_TAG, "").split(",") if name]
    start = run_tags.get(FEAST_ENTITY_TIME_TAG, "").split(" .. ")[0]
    if not views or start in ("", "None"):
        raise SourceError(
            f"pipeline {config.pipeline}: the training run has no {FEAST_FEATURE_VIEWS_TAG} / {FEAST_ENTITY_TIME_TAG} tags, so "
            "which feature views to load into the online store is unknown; nothing is promoted"
        )
    end = datetime.now(UTC)
    where = f"data.feature_store: loading {', '.join(views)} into the online store failed, so the champion does not move"
    with named_errors(config, where):
        result = client.materialize(
            python=client.feast_python(section.python),
            repo=repo_path(section),
            feature_views=views,
            end=end,
            cover_from=datetime.fromisoformat(start),
        )
    for name, span in sorted((result.get("views") or {}).items()):
        how = "first load" if span.get("first") else "incremental"
        log.info(
            "materialised feature view %s into the online store: %s .. %s (%s)",
            name,
            span.get("start"),
            span.get("end"),
            how,
        )
    tags = {
        FEAST_MATERIALIZED_VIEWS_TAG: ",".join(views),
        FEAST_MATERIALIZED_UNTIL_TAG: end.isoformat(timespec="seconds"),
    }
    hook.set_version_tags(model_name or config.registered_model_name, version, tags)


def load_version_online(hook: Any, model_name: str, version: str, log: Any) -> None:
    """`load_online` for a version moved by hand (`trainpipe promote` / `rollback`), with no
    pipeline config at hand: a version trained on feature-store features has its views loaded
    as its run's logged config (`spec.json`) says; any other version has nothing to load."""
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.registry.reproduce import logged_version

    run_id = str(hook.model_version(model_name, version).run_id)
    if FEAST_FEATURE_VIEWS_TAG not in hook.call(finished_run, run_id).data.tags:
        return
    config = TrainSpec.model_validate(logged_version(hook, f"{model_name}/{version}").spec).config
    load_online(hook, config, version, run_id, log, model_name=model_name)
