"""KServe: the canary as InferenceService manifests, for teams that serve on Kubernetes.

KServe's own canary (`spec.predictor.canaryTrafficPercent`) sends that share to the latest
revision of the InferenceService and the rest to the previous ready one: applying the manifest of
each step moves the traffic, and KServe keeps both revisions. It never judges or promotes by
itself; that is this package's loop, with the checks of the other backends read from the team's
monitoring. Rendered here (`trainpipe render --task canary`), applied by the team's deployment.
"""

from __future__ import annotations

import re
from typing import Any

from airflow_trainpipe.config import PipelineConfig


def service_name(pipeline: str) -> str:
    """A DNS-1035 label from the pipeline's name (KServe names Knative services after it)."""
    name = re.sub(r"[^a-z0-9-]+", "-", pipeline.lower()).strip("-")
    name = name if name[:1].isalpha() else f"m-{name}"
    return name[:45].rstrip("-")  # KServe appends suffixes such as -predictor-00001


def inference_services(
    config: PipelineConfig,
    version: str,
    storage_uri: str,
    namespace: str | None = None,
    service_account: str | None = None,
) -> list[dict[str, Any]]:
    """One manifest per step of `canary.steps` (the last step at 100% drops canaryTrafficPercent:
    the new revision takes all traffic), then the rollback's (0%: all traffic on the previous one)."""
    steps = config.canary.steps if config.canary is not None else [100.0]
    documents = []
    for number, percent in enumerate(steps, start=1):
        documents.append(
            _manifest(config, version, storage_uri, namespace, service_account, f"step {number}", percent)
        )
    documents.append(_manifest(config, version, storage_uri, namespace, service_account, "rollback", 0.0))
    return documents


def _manifest(
    config: PipelineConfig,
    version: str,
    storage_uri: str,
    namespace: str | None,
    service_account: str | None,
    stage: str,
    percent: float,
) -> dict[str, Any]:
    predictor: dict[str, Any] = {
        "model": {"modelFormat": {"name": "mlflow"}, "protocolVersion": "v2", "storageUri": storage_uri},
    }
    if percent < 100.0:
        # KServe takes a whole percent; a step's share is rounded up so a 0.5% step still gets traffic.
        predictor["canaryTrafficPercent"] = 0 if percent <= 0 else max(1, round(percent))
    if service_account:
        predictor["serviceAccountName"] = service_account
    metadata: dict[str, Any] = {
        "name": service_name(config.pipeline),
        "labels": {
            "app.kubernetes.io/managed-by": "airflow-trainpipe",
            "trainpipe/pipeline": service_name(config.pipeline),
        },
        "annotations": {
            "trainpipe/model": f"{config.registered_model_name}/{version}",
            "trainpipe/canary-stage": stage,
        },
    }
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {"predictor": predictor},
    }
