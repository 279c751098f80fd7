"""`training.kubernetes`: where and how the training pods run with `launcher: kubernetes`.

Credentials never appear here: pods read them from Kubernetes Secrets, named by reference
(`env_from`, `env_keys`), so the values stay in the cluster and out of configs, manifests and logs.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator

from airflow_trainpipe.config.base import Section, field_problems
from airflow_trainpipe.config.secrets import credential_in_value
from airflow_trainpipe.config.types import PositiveDuration, Quantity

# DNS-1123 subdomain (Secret, PriorityClass, ServiceAccount names) and label (namespace).
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"

# Set by the launcher itself; a config value would silently change what the pod runs.
RESERVED_ENV = (
    "TRAINPIPE_SPEC",
    "TRAINPIPE_HOME",
    "TRAINPIPE_TRY_NUMBER",
    "NODE_RANK",
    "DS_ACCELERATOR",
    "HOME",
    "TMPDIR",
)


class Toleration(Section):
    """A taint the training pods tolerate (e.g. spot or GPU node pools)."""

    key: str | None = None
    """Taint key; empty with `operator: Exists` tolerates every taint."""

    operator: Literal["Equal", "Exists"] = "Equal"
    """`Equal` matches `value`; `Exists` matches any value of `key`."""

    value: str | None = None
    """Taint value (with `operator: Equal`)."""

    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; empty tolerates all effects."""

    toleration_seconds: PositiveInt | None = None
    """With `NoExecute`: how long a pod stays bound after the taint appears."""


class EnvKey(Section):
    """One environment variable read from a key of a Kubernetes Secret."""

    name: str = Field(pattern=_ENV_NAME)
    """Environment variable in the training container, e.g. `AWS_ACCESS_KEY_ID`."""

    source: str = Field(alias="from", min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)
    """Name of the Kubernetes Secret (in the pods' namespace) holding the value."""

    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key inside that Secret."""


class VolumeMount(Section):
    """A PersistentVolumeClaim mounted into every training pod (shared file:// storage)."""

    claim: str = Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)
    """Name of the PersistentVolumeClaim (ReadWriteMany for several nodes)."""

    mount_path: str = Field(pattern=r"^/[^:]*$")
    """Absolute path it is mounted at; `file://` data and checkpoint URIs must lie under one."""

    read_only: bool = False
    """Mount read-only (e.g. a data volume)."""


class KubernetesSection(Section):
    """Pods of `launcher: kubernetes`: one pod for one node, an Indexed Job with a headless Service for several."""

    namespace: str | None = Field(default=None, max_length=63, pattern=_DNS_LABEL)
    """Namespace of the pods; default: the connection's namespace, else `default`."""

    kubernetes_conn_id: str = Field(default="kubernetes_default", min_length=1)
    """Airflow connection of the cluster (in-cluster config, kubeconfig or context)."""

    service_account: str | None = Field(default=None, min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)
    """ServiceAccount of the pods, e.g. one bound to a cloud IAM role for s3:// access."""

    node_selector: dict[str, str] = {}
    """Node labels the pods require, e.g. `{karpenter.sh/capacity-type: spot}`."""

    tolerations: list[Toleration] = []
    """Taints the pods tolerate (spot, GPU node pools)."""

    priority_class: str | None = Field(default=None, min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)
    """PriorityClass of the pods (preemptible batch vs. important retrains)."""

    annotations: dict[str, str] = {}
    """Pod annotations, e.g. `{karpenter.sh/do-not-disrupt: "true"}`."""

    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """When the kubelet pulls `training.image`."""

    registry_auth: list[str] = []
    """Names of docker-registry Secrets used to pull the image (the pods' imagePullSecrets)."""

    shm_size: Quantity = "2Gi"
    """Size of the memory-backed `/dev/shm` (NCCL and data loaders need more than the 64 MiB default)."""

    run_as_user: PositiveInt = 1000
    """Non-root UID (and GID) the trainer runs as; the trainer image's user."""

    env: dict[str, str] = {}
    """Plain environment of the trainer, e.g. `MLFLOW_TRACKING_URI`, `AWS_ENDPOINT_URL`; never credentials."""

    env_from: list[str] = []
    """Kubernetes Secrets whose keys all become environment variables (names only; values stay in the cluster)."""

    env_keys: list[EnvKey] = []
    """Single environment variables from Secret keys: `{name: AWS_ACCESS_KEY_ID, from: trainpipe-aws, key: access-key-id}`."""

    aws_conn_id: str | None = Field(default=None, min_length=1)
    """Airflow AWS connection for s3://: resolved when the task runs into a Kubernetes Secret of that try, which the pods read (values never enter the manifest or the log)."""

    volumes: list[VolumeMount] = []
    """PersistentVolumeClaims mounted into every pod (for `file://` data or checkpoints)."""

    min_nodes: PositiveInt | None = None
    """Elastic resume: start (or resume) with as few as this many nodes when not all of `resources.nodes` can be had."""

    startup_timeout: PositiveDuration = timedelta(minutes=10)
    """How long a pod may wait for a node and its image before the try fails."""

    backoff_limit: NonNegativeInt = 0
    """Pod failures the Indexed Job retries itself; 0 leaves retries to Airflow (a new try resumes from the checkpoint)."""

    queue: str | None = None
    """Kueue LocalQueue (in the pods' namespace) the try waits in: the Pod or Job gets the `kueue.x-k8s.io/queue-name` label and the Job starts suspended until Kueue admits it; the wait in the queue does not count against `startup_timeout`. Needs Kueue (with its `pod` integration for one node); without Kueue a suspended Job never starts."""

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not re.match(_ENV_NAME, name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name in RESERVED_ENV:
                raise ValueError(f"{name} is set by the launcher and cannot be overridden")
            # Values land in the pod manifest in clear text: checked for credentials as keys are.
            if kind := credential_in_value(text):
                field_problems(
                    [
                        (
                            (name,),
                            f"the value carries {kind}; put credentials in a Kubernetes Secret "
                            "(env_keys / env_from) or an Airflow connection, never in a config",
                        )
                    ]
                )
        return value

    @field_validator("registry_auth", "env_from")
    @classmethod
    def _object_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.match(_DNS_SUBDOMAIN, name) or len(name) > 253:
                raise ValueError(
                    f"expected the name of a Kubernetes Secret (lower-case DNS name), got {name!r}"
                )
        return value

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, value: str | None) -> str | None:
        # A LocalQueue's name is an object name (DNS-1123 subdomain), and it travels in the
        # `kueue.x-k8s.io/queue-name` label, whose values stop at 63 characters: a name outside
        # both would never match a queue, and the try would wait for admission until it times out.
        if value is not None and (len(value) > 63 or not re.fullmatch(_DNS_SUBDOMAIN, value)):
            raise ValueError(
                "expected the name of a Kueue LocalQueue (at most 63 characters: lowercase letters, "
                f"digits, '-' and '.', starting and ending with a letter or digit), got {value!r}"
            )
        return value
