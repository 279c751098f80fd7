"""Kubernetes manifests of a training job, as plain dicts: pure functions, no kubernetes import and
no cluster (kubernetes_cluster.py submits them).

One node: a Pod (submitted by KubernetesPodOperator). Several nodes: an Indexed Job whose pods
find each other through a headless Service; torchrun's rendezvous runs on the index-0 pod's DNS
name, and each pod's node rank is its completion index. Every pod runs the entrypoint that
`launcher: local` runs, under torchrun, with the TrainSpec in the `TRAINPIPE_SPEC` variable.
With `training.kubernetes.queue`, the Pod, or the Job and its pod template, carry Kueue's
`kueue.x-k8s.io/queue-name` label and the Job is created suspended (Kueue unsuspends it).

The same functions feed the operator, `trainpipe render` and the tests, so what is validated and
run locally is what the cluster gets.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from airflow_trainpipe.config import PipelineConfig
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.launchers.command import torchrun_command, torchrun_environment

CONTAINER = "base"  # KubernetesPodOperator follows the logs of the container with this name
RENDEZVOUS_PORT = 29500
SCRATCH = "/var/tmp/trainpipe"  # TRAINPIPE_HOME, HOME and TMPDIR: the root filesystem is read-only
JOB_NAME_PREFIX = "job-"  # KubernetesJobOperator prepends it to the name it is given
TTL_AFTER_FINISHED_S = 3600
# Kueue's label naming the LocalQueue of a workload (Job, or a plain Pod with its `pod` integration).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
_COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


@dataclass(frozen=True)
class RunLabels:
    """The task instance a workload belongs to; KubernetesPodOperator finds pods by these labels."""

    dag_id: str
    task_id: str
    run_id: str
    try_number: int

    def labels(self) -> dict[str, str]:
        # The keys and the sanitising are KubernetesPodOperator's own (_get_ti_pod_labels), so a
        # reattaching operator and a person running `kubectl get -l` see the same values.
        return {
            "dag_id": label_value(self.dag_id),
            "task_id": label_value(self.task_id),
            "run_id": label_value(self.run_id),
            "try_number": str(self.try_number),
            "app.kubernetes.io/name": "trainpipe",
            "app.kubernetes.io/component": "trainer",
        }

    def workload_name(self) -> str:
        """Deterministic per try: a new try gets a new pod/job, the same try finds its own again."""
        stem = re.sub(r"[^a-z0-9]+", "-", self.dag_id.lower()).strip("-")[:24].strip("-") or "train"
        digest = hashlib.sha256(f"{self.dag_id}\0{self.task_id}\0{self.run_id}".encode()).hexdigest()[:8]
        return f"{stem}-{digest}-{self.try_number}"


def label_value(text: str) -> str:
    """Airflow's make_safe_label_value: valid label characters, at most 63, hashed when changed."""
    safe = re.sub(r"^[^a-z0-9A-Z]*|[^a-zA-Z0-9_\-\.]|[^a-z0-9A-Z]*$", "", text)
    if len(safe) > 63 or safe != text:
        digest = hashlib.md5(text.encode()).hexdigest()[:9]  # a label suffix, not security
        safe = safe[: 63 - len(digest) - 1] + "-" + digest
    return safe


def escape_expansion(value: str) -> str:
    """Kubernetes expands `$(VAR)` in env values, command and args; `$$(` keeps it literal."""
    return value.replace("$(", "$$(")


def container_command(
    config: PipelineConfig, job_name: str | None = None, service: str | None = None
) -> list[str]:
    """The container command: the local launcher's torchrun command, with the nodes'
    rendezvous when the job has several."""
    resources = config.training.resources
    rendezvous: tuple[str, ...] = ("--standalone",)
    if resources.nodes > 1:
        host = f"{job_name}-0.{service}"  # the index-0 pod, through the headless Service
        min_nodes = config.training.kubernetes.min_nodes
        if min_nodes is None:
            # Static rendezvous: rank 0 hosts the store; node ranks are the completion indexes.
            rendezvous = (
                "--nnodes", str(resources.nodes), "--node-rank", "$(NODE_RANK)",
                "--master-addr", host, "--master-port", str(RENDEZVOUS_PORT),
            )  # fmt: skip
        else:
            # Elastic: start with the nodes that arrive (at least min_nodes); the job resumes from
            # its checkpoint on the world size it got (universal checkpoint when it changed).
            rendezvous = (
                "--nnodes", f"{min_nodes}:{resources.nodes}", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{host}:{RENDEZVOUS_PORT}", "--rdzv-id", job_name or "trainpipe",
                "--max-restarts", "3",
            )  # fmt: skip
    return torchrun_command(
        resources.nproc_per_node, "$(TRAINPIPE_SPEC)", python="python", rendezvous=rendezvous
    )


def _env(spec: TrainSpec, labels: RunLabels, multi_node: bool) -> list[dict]:
    config = spec.config
    k8s = config.training.kubernetes
    env: list[dict] = [
        {"name": "TRAINPIPE_SPEC", "value": escape_expansion(spec.to_json())},
        {"name": "TRAINPIPE_TRY_NUMBER", "value": str(labels.try_number)},
        {"name": "TRAINPIPE_HOME", "value": SCRATCH},
        {"name": "HOME", "value": SCRATCH},
        {"name": "TMPDIR", "value": SCRATCH},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        # Models are built from a config and tokenizers trained from the data: nothing is ever
        # fetched from a model hub, and a pod must not try (it would wait on the network).
        {"name": "HF_HUB_OFFLINE", "value": "1"},
    ]
    shutdown = torchrun_environment(config.training.checkpoint.shutdown_timeout_s)
    env += [{"name": name, "value": value} for name, value in shutdown.items()]
    if config.training.resources.gpus_per_node == 0:
        env.append({"name": "DS_ACCELERATOR", "value": "cpu"})
    if multi_node:
        env.append({"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": _COMPLETION_INDEX}}})
    env += [{"name": name, "value": escape_expansion(value)} for name, value in sorted(k8s.env.items())]
    env += [
        {"name": ref.name, "valueFrom": {"secretKeyRef": {"name": ref.source, "key": ref.key}}}
        for ref in k8s.env_keys
    ]
    return env


def pod_spec(spec: TrainSpec, labels: RunLabels, *, job_name: str | None = None) -> dict:
    """The PodSpec of every training pod (the Pod itself, or the Job's pod template)."""
    config = spec.config
    k8s = config.training.kubernetes
    multi_node = config.training.resources.nodes > 1
    pod: dict = {
        "restartPolicy": "Never",
        "containers": [_container(spec, labels, job_name)],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": k8s.shm_size}},
            {"name": "scratch", "emptyDir": {}},
            *(
                {
                    "name": f"data-{i}",
                    "persistentVolumeClaim": {"claimName": v.claim, "readOnly": v.read_only},
                }
                for i, v in enumerate(k8s.volumes)
            ),
        ],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": k8s.run_as_user,
            "runAsGroup": k8s.run_as_user,
            "fsGroup": k8s.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # The trainer never calls the Kubernetes API; cloud identity (IRSA, workload identity)
        # is projected separately from this token.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # A SIGTERM (a spot reclaim, the pod deleted) gives the ranks the configured grace to
        # checkpoint, and torchrun its shutdown after it, before the kubelet SIGKILLs.
        "terminationGracePeriodSeconds": config.training.checkpoint.termination_grace_s,
        **_placement(config),
    }
    if multi_node:
        pod["subdomain"] = job_name  # pods become <job>-<index>.<service>
    return pod


def _container(spec: TrainSpec, labels: RunLabels, job_name: str | None) -> dict:
    config = spec.config
    training, k8s = config.training, config.training.kubernetes
    resources = training.resources
    multi_node = resources.nodes > 1
    limits: dict[str, str] = {"memory": resources.memory}
    if resources.gpus_per_node:
        limits["nvidia.com/gpu"] = str(resources.gpus_per_node)
    container: dict = {
        "name": CONTAINER,
        "image": training.image,
        "imagePullPolicy": k8s.image_pull_policy,
        "command": container_command(config, job_name, job_name),
        "env": _env(spec, labels, multi_node),
        "resources": {"requests": {"cpu": resources.cpu, "memory": resources.memory}, "limits": limits},
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "scratch", "mountPath": SCRATCH},
            *(
                {"name": f"data-{i}", "mountPath": v.mount_path, "readOnly": v.read_only}
                for i, v in enumerate(k8s.volumes)
            ),
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    # The Secret of this try's connections: S3 credentials, and a trial's study storage.
    secret = k8s.aws_conn_id or (spec.trial is not None and spec.trial.rungs)
    env_from = [*k8s.env_from, *([connection_secret_name(labels)] if secret else [])]
    if env_from:
        container["envFrom"] = [{"secretRef": {"name": name}} for name in env_from]
    if multi_node:
        container["ports"] = [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"}]
    return container


def _placement(config: PipelineConfig) -> dict:
    """Where the pods may run and what they may pull: the optional PodSpec fields the config sets."""
    k8s = config.training.kubernetes
    placement: dict = {}
    if k8s.service_account:
        placement["serviceAccountName"] = k8s.service_account
    if k8s.node_selector:
        placement["nodeSelector"] = dict(k8s.node_selector)
    if k8s.tolerations:
        placement["tolerations"] = [
            {
                key: value
                for key, value in (
                    ("key", t.key),
                    ("operator", t.operator),
                    ("value", t.value),
                    ("effect", t.effect),
                    ("tolerationSeconds", t.toleration_seconds),
                )
                if value is not None
            }
            for t in k8s.tolerations
        ]
    if k8s.priority_class:
        placement["priorityClassName"] = k8s.priority_class
    if k8s.registry_auth:
        placement["imagePullSecrets"] = [{"name": name} for name in k8s.registry_auth]
    return placement


def connection_secret_name(labels: RunLabels) -> str:
    """The Secret holding this try's credentials from Airflow connections."""
    return f"{labels.workload_name()}-conn"


def connection_secret(
    config: PipelineConfig, labels: RunLabels, namespace: str, values: dict[str, str]
) -> dict:
    """Credentials resolved from Airflow connections, for the API only: never rendered or logged."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            k: v
            for k, v in _metadata(connection_secret_name(labels), namespace, labels, config).items()
            if k != "annotations"
        },
        "type": "Opaque",
        "stringData": values,
    }


def _metadata(name: str, namespace: str, labels: RunLabels, config: PipelineConfig) -> dict:
    metadata: dict = {
        "name": name,
        "namespace": namespace,
        "labels": {**labels.labels(), "trainpipe/pipeline": label_value(config.pipeline)},
    }
    if config.training.kubernetes.annotations:
        metadata["annotations"] = dict(config.training.kubernetes.annotations)
    return metadata


def _workload_metadata(name: str, namespace: str, labels: RunLabels, config: PipelineConfig) -> dict:
    """The Pod's or the Job's metadata: with a queue, Kueue's label naming its LocalQueue."""
    metadata = _metadata(name, namespace, labels, config)
    if config.training.kubernetes.queue is not None:
        metadata["labels"][QUEUE_LABEL] = config.training.kubernetes.queue
    return metadata


def pod_manifest(spec: TrainSpec, labels: RunLabels, namespace: str) -> dict:
    """One node: the Pod that KubernetesPodOperator submits."""
    config = spec.config
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _workload_metadata(labels.workload_name(), namespace, labels, config),
        "spec": pod_spec(spec, labels),
    }


def job_manifest(spec: TrainSpec, labels: RunLabels, namespace: str) -> dict:
    """Several nodes: an Indexed Job, one pod per node, all of them needed (or min_nodes, elastic)."""
    config = spec.config
    nodes = config.training.resources.nodes
    name = JOB_NAME_PREFIX + labels.workload_name()
    metadata = _workload_metadata(name, namespace, labels, config)
    template_metadata = {key: value for key, value in metadata.items() if key in ("labels", "annotations")}
    job_spec: dict = {
        "completionMode": "Indexed",
        "completions": nodes,
        "parallelism": nodes,
        "backoffLimit": config.training.kubernetes.backoff_limit,
        "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
        "template": {"metadata": template_metadata, "spec": pod_spec(spec, labels, job_name=name)},
    }
    if config.training.kubernetes.queue is not None:
        # Kueue's documented form: created suspended, no pod exists until Kueue admits the Job
        # and unsuspends it (its webhook would suspend it too; here it does not depend on that).
        job_spec["suspend"] = True
    if config.training.kubernetes.min_nodes is not None:
        # Index 0 finishes only when training does; pods that never got a node must not keep
        # the Job running (successPolicy: beta in 1.31, GA in 1.33).
        job_spec["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}


def service_manifest(config: PipelineConfig, labels: RunLabels, namespace: str, job_name: str) -> dict:
    """Headless Service giving each Job pod a DNS name before it is ready (for the rendezvous)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            key: value
            for key, value in _metadata(job_name, namespace, labels, config).items()
            if key != "annotations"
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"batch.kubernetes.io/job-name": job_name},
            "ports": [
                {
                    "name": "rendezvous",
                    "port": RENDEZVOUS_PORT,
                    "targetPort": RENDEZVOUS_PORT,
                    "protocol": "TCP",
                }
            ],
        },
    }


def manifests(spec: TrainSpec, labels: RunLabels, namespace: str | None = None) -> list[dict]:
    """What a try submits: [Pod] for one node, [Job, Service] for several."""
    config = spec.config
    namespace = namespace or config.training.kubernetes.namespace or "default"
    if config.training.resources.nodes == 1:
        return [pod_manifest(spec, labels, namespace)]
    job = job_manifest(spec, labels, namespace)
    return [job, service_manifest(config, labels, namespace, job["metadata"]["name"])]
