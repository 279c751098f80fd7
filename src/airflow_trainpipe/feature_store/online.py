"""Online features for a promoted model: its feature views loaded into the online store first.

Called by the register task (no approval) and the promote task (after approval) before the
champion alias moves, so a serving stack that follows the alias never reads a model whose
features are not online. The views and the time the training rows covered come from the
training run's lineage tags, so the model being promoted decides, not today's config.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig

VIEWS_TAG = "trainpipe.feast_feature_views"
ENTITY_TIME_TAG = "trainpipe.feast_entity_time"


def materialize_for_promotion(
    config: PipelineConfig, run_tags: Mapping[str, str], log: Any, *, now: datetime | None = None
) -> dict[str, str]:
    """Materialise the views the run trained on, up to now; the version tags that record it
    (none when the pipeline has no feature store or `materialize` is off)."""
    from airflow_trainpipe.feature_store import client
    from airflow_trainpipe.feature_store.join import repo_path
    from airflow_trainpipe.sources.sql import SourceError

    section = config.data.feature_store
    if section is None or not section.materialize:
        return {}
    views = [name for name in run_tags.get(VIEWS_TAG, "").split(",") if name]
    start = run_tags.get(ENTITY_TIME_TAG, "").split(" .. ")[0]
    if not views or start in ("", "None"):
        raise SourceError(
            f"pipeline {config.pipeline}: the training run has no {VIEWS_TAG} / {ENTITY_TIME_TAG} tags, so "
            "which feature views to load into the online store is unknown; nothing is promoted"
        )
    end = now or datetime.now(UTC)
    try:
        result = client.materialize(
            python=client.feast_python(section.python),
            repo=repo_path(section),
            feature_views=views,
            end=end,
            cover_from=datetime.fromisoformat(start),
        )
    except SourceError as exc:
        raise type(exc)(
            f"pipeline {config.pipeline}, data.feature_store: loading {', '.join(views)} into the online store "
            f"failed, so the champion does not move: {exc}"
        ) from exc
    for name, span in sorted((result.get("views") or {}).items()):
        how = "first load" if span.get("first") else "incremental"
        log.info(
            "materialised feature view %s into the online store: %s .. %s (%s)",
            name,
            span.get("start"),
            span.get("end"),
            how,
        )
    return {
        "trainpipe.feast_materialized_views": ",".join(views),
        "trainpipe.feast_materialized_until": end.isoformat(timespec="seconds"),
    }
