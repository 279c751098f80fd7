"""Names of our datasets in OpenLineage's (namespace, name) form.

Storage paths follow the spec (`core.storage.dataset_name`: `file` + path, `s3://bucket` + key);
what the spec does not name is ours, and documented in docs/lineage.md:

- a snapshot: its manifest in the snapshot store, `<data.uri>/_trainpipe/snapshots/<sha256>.json`,
  so the same rows are the same dataset whichever run froze them;
- a trained model: namespace the MLflow tracking server (`http://host:port`, user-info dropped;
  the store's URI for a database store), name `runs/<run id>/model`;
- a registered model version: the same namespace, name `models/<registered name>/versions/<n>`;
- a pretrained directory a model was fine-tuned from: its storage path, or the registered version
  (`models:/NAME/N`) named as above.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from airflow_trainpipe.config import PipelineConfig
from airflow_trainpipe.config.types import registered_version
from airflow_trainpipe.core.storage import dataset_name
from airflow_trainpipe.data.snapshots.manifests import manifest_uri


def snapshot_name(config: PipelineConfig, digest: str) -> tuple[str, str]:
    return dataset_name(manifest_uri(config.data, digest))


def tracking_namespace(tracking_uri: str) -> str:
    """The tracking server as a namespace: never its credentials."""
    parts = urlsplit(tracking_uri)
    if not parts.netloc:
        return tracking_uri  # sqlite:////abs/mlflow.db, file:///abs/mlruns: the store itself
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://{host}{parts.path.rstrip('/')}"


def run_model_name(run_id: str) -> str:
    return f"runs/{run_id}/model"


def model_version_name(model_name: str, version: str) -> str:
    return f"models/{model_name}/versions/{version}"


def pretrained_name(source: str, tracking_uri: str) -> tuple[str, str]:
    """A pinned pretrained source: a registered version, or a directory in storage."""
    if (version := registered_version(source)) is not None and version[1] is not None:
        return tracking_namespace(tracking_uri), model_version_name(version[0], version[1])
    return dataset_name(source)
