"""The run's training set from a feature store: the source's rows joined with Feast features.

The entity rows (the source's snapshot: keys, event time, label) are staged locally, verified
byte for byte against their manifest, and handed to Feast in its own interpreter
(`feature_store.client`); the joined rows come back as one Parquet file, which is frozen into the
snapshot store like any export. The manifest keeps the entity rows' source and window, and adds
what was joined: the Feast project, the references and each view's definition hash.

A view whose features changed type (or lost a feature) since the pipeline's last run stops the
run before anything is frozen: a model trained on it would read a different thing under the same
name, and the champion it is compared with could not score it. The trigger form's
`accept_feature_changes` accepts the new definitions once.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.config.feature_store import ACCEPT_CHANGES_PARAM
from airflow_trainpipe.core.storage import filesystem, join, resolve, trainpipe_home
from airflow_trainpipe.data.sources.errors import SourceError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.config.feature_store import FeatureStoreSection
    from airflow_trainpipe.contracts.manifest import FeatureLineage, Manifest
    from airflow_trainpipe.data.feature_store.client import Retrieval

FEATURE_REMEDY = "cast it in the feature view's schema, or list it in data.features.categorical"


class FeatureSchemaChanged(SourceError):
    """A feature view's features changed type or went away since the pipeline's last run."""


def repo_path(section: FeatureStoreSection) -> Path:
    """The feature repo's folder, which must hold `feature_store.yaml`."""
    path = Path(section.repo)
    path = path if path.is_absolute() else trainpipe_home() / path
    if not (path / "feature_store.yaml").is_file():
        raise SourceError(f"feature repo {path} has no feature_store.yaml (data.feature_store.repo)")
    return path


def join_features(
    config: PipelineConfig, entity: Manifest, context: Mapping[str, Any], conn_id: str | None = None
) -> Manifest:
    """The entity rows joined with the configured features as of each row's event time, frozen."""
    from airflow_trainpipe.data.feature_store import client
    from airflow_trainpipe.data.snapshots.store import freeze_file, scratch_folder
    from airflow_trainpipe.data.sources.base import check_columns

    section = config.data.feature_store
    assert section is not None
    python, repo = client.feast_python(section.python), repo_path(section)
    with scratch_folder(config) as folder:
        retrieval = client.retrieve(
            python=python,
            repo=repo,
            entity_files=_staged_entity_files(entity, config.data.format, folder, conn_id),
            timestamp_column=section.timestamp_column,
            output=folder / "joined.parquet",
            features=section.features,
            feature_service=section.feature_service,
            full_feature_names=section.full_feature_names,
        )
        schema = _schema(retrieval.output)
        check_columns(config, schema, FEATURE_REMEDY)
        lineage = _lineage(
            section, retrieval, entity.digest, _time_range(retrieval.output, section.timestamp_column)
        )
        accepted = bool((context.get("params") or {}).get(ACCEPT_CHANGES_PARAM))
        previous = _check_unchanged(config, lineage, accepted, conn_id)
        files = [freeze_file(retrieval.output, retrieval.rows, config.snapshots.uri, conn_id)]
    manifest = _manifest(entity, files, schema, lineage)
    _store(config, manifest, conn_id)
    _record_views(config, manifest, previous, conn_id)
    return manifest


def _staged_entity_files(entity: Manifest, fmt: str, folder: Path, conn_id: str | None) -> list[Path]:
    """The entity rows as local Parquet files, each checked against its manifest sha256 as it is
    copied: what is joined is exactly the snapshot the source gave."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from airflow_trainpipe.data.snapshots.store import copy_hashed

    staged = []
    for index, entry in enumerate(entity.files):
        target = folder / f"entity-{index:05d}.{fmt}"
        with target.open("wb") as out:
            sha256 = copy_hashed(entry.uri, out, conn_id)
        if sha256 != entry.sha256:
            raise SourceError(f"{entry.uri} changed since the source gave it; nothing is joined or frozen")
        if fmt == "csv":
            parquet = target.with_suffix(".parquet")
            pq.write_table(pacsv.read_csv(target), parquet)
            target.unlink()
            target = parquet
        staged.append(target)
    if not staged:
        raise SourceError("the source gave no entity rows to join features to")
    return staged


def _schema(path: Path) -> Any:
    import pyarrow.parquet as pq

    return pq.read_schema(path)


def _time_range(path: Path, column: str) -> tuple[str | None, str | None]:
    """The earliest and latest event time of the joined rows, ISO 8601 in UTC."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    times = pq.read_table(path, columns=[column]).column(0)
    bounds = pc.min_max(times).as_py()
    return _iso(bounds["min"]), _iso(bounds["max"])


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        value = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return str(value.astimezone(UTC).isoformat())
    return str(value)


def _lineage(
    section: FeatureStoreSection,
    retrieval: Retrieval,
    entity_digest: str,
    times: tuple[str | None, str | None],
) -> FeatureLineage:
    from airflow_trainpipe.contracts.manifest import FeatureLineage, FeatureViewLineage

    views = {
        view.name: FeatureViewLineage(
            sha256=view.sha256,
            ttl_seconds=view.ttl_seconds,
            join_keys=list(view.join_keys),
            dtypes=view.schema,
        )
        for view in retrieval.views
    }
    definitions = hashlib.sha256("".join(f"{name}={views[name].sha256}\n" for name in sorted(views)).encode())
    return FeatureLineage(
        project=retrieval.project,
        repo=section.repo,
        feature_service=section.feature_service,
        features=list(retrieval.features),
        views=views,
        definitions_sha256=definitions.hexdigest(),
        entity_digest=entity_digest,
        entity_start=times[0],
        entity_end=times[1],
    )


def views_uri(config: PipelineConfig) -> str:
    """The pipeline's record of the feature views its last run joined from."""
    from airflow_trainpipe.data.snapshots.partitions import STATE_DIR

    return join(resolve(config.data.uri), STATE_DIR, "feature_views", f"{config.pipeline}.json")


def _check_unchanged(
    config: PipelineConfig, lineage: FeatureLineage, accepted: bool, conn_id: str | None
) -> dict[str, Any]:
    """The recorded views; raises when a used view lost a feature or changed one's type since."""
    fs, path = filesystem(views_uri(config), conn_id)
    previous: dict[str, Any] = json.loads(fs.cat_file(path)) if fs.exists(path) else {}
    changes = []
    for name, view in sorted(lineage.views.items()):
        before = (previous.get("views") or {}).get(name)
        if before is None:
            continue
        for feature, dtype in sorted(before["dtypes"].items()):
            now = view.dtypes.get(feature)
            if now != dtype:
                changes.append(f"{name}:{feature} was {dtype}, is {now or 'gone'}")
    if changes and not accepted:
        raise FeatureSchemaChanged(
            f"feature view schema changed since the last run ({previous.get('digest', '?')[:19]}): "
            f"{'; '.join(changes)}. A model trained now would read a different thing under the same name "
            f"and the champion could not score it; fix the view, or trigger a run with {ACCEPT_CHANGES_PARAM} "
            "to accept the new definitions"
        )
    return previous


def _manifest(entity: Manifest, files: list[Any], schema: Any, lineage: FeatureLineage) -> Manifest:
    from airflow_trainpipe.contracts.manifest import Manifest
    from airflow_trainpipe.core.digest import combine

    return Manifest(
        partition_uri=entity.partition_uri,
        format="parquet",
        files=files,
        rows=sum(f.rows for f in files),
        columns={field.name: str(field.type) for field in schema},
        digest=combine([f.sha256 for f in files]),
        window=entity.window,
        missing=entity.missing,
        source=entity.source,
        features=lineage,
    )


def _store(config: PipelineConfig, manifest: Manifest, conn_id: str | None) -> None:
    from airflow_trainpipe.data.snapshots.manifests import store_manifest
    from airflow_trainpipe.data.snapshots.store import record_use

    store_manifest(config.data, manifest, conn_id)
    record_use(config, manifest, conn_id)


def _record_views(
    config: PipelineConfig, manifest: Manifest, previous: dict[str, Any], conn_id: str | None
) -> None:
    """Remember the views as joined now (views this run did not use keep their last record)."""
    assert manifest.features is not None
    views = {**(previous.get("views") or {})}
    views.update({name: view.model_dump(mode="json") for name, view in manifest.features.views.items()})
    document = {
        "digest": manifest.digest,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "views": views,
    }
    fs, path = filesystem(views_uri(config), conn_id)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, json.dumps(document, indent=1).encode())
