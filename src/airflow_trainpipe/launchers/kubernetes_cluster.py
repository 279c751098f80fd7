"""The side that talks to the cluster: submits a training job with the cncf.kubernetes provider's
operators and hook (the manifests themselves come from kubernetes_manifests.py, which is pure).

Imported by DistributedTrainOperator.execute only (it pulls in the kubernetes client).

- One node: a KubernetesPodOperator with `durable=True`, so a worker that restarts mid-training
  reattaches to the running pod (task_state_store) instead of starting another.
- Several nodes: a KubernetesJobOperator builds the Indexed Job (labels, namespace, templating);
  this module creates it with a headless Service owned by the Job (deleting the Job deletes the
  Service), follows the index-0 pod's log and waits for the Job. A retry first deletes what an
  earlier try of the same task left running, then starts a new Job that resumes from the
  checkpoint in the run directory.
- With `training.kubernetes.queue` (Kueue), the Job is created suspended and the Pod is held by
  Kueue's scheduling gate until Kueue admits them; the try waits for that admission without a
  deadline of its own, and `startup_timeout` counts from it (see _await_admission).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from kubernetes.client import ApiClient
from kubernetes.client import models as k8s
from kubernetes.client.rest import ApiException

from airflow_trainpipe.config import PipelineConfig
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.core.exceptions import TrainingJobError
from airflow_trainpipe.launchers.kubernetes_manifests import (
    CONTAINER,
    JOB_NAME_PREFIX,
    QUEUE_LABEL,
    RunLabels,
    connection_secret,
    job_manifest,
    label_value,
    pod_manifest,
    service_manifest,
)
from airflow_trainpipe.launchers.watcher import JobWatcher

ADMISSION_POLL_S = 10
ADMISSION_LOG_EVERY_S = 300
# Kueue gates the pods it manages (`kueue.x-k8s.io/admission`, and `kueue.x-k8s.io/topology` with
# topology-aware scheduling) and removes its gates on admission.
KUEUE_GATE_PREFIX = "kueue.x-k8s.io/"


def to_model(data: dict, klass: str) -> Any:
    """A kubernetes client model from a manifest dict, through the client's public deserializer."""

    class _Response:
        def __init__(self, text: str):
            self.data = text

    return ApiClient().deserialize(_Response(json.dumps(data)), klass)


def _common(
    config: PipelineConfig, task_id: str, watcher: JobWatcher, name: str, labels: dict[str, str]
) -> dict[str, Any]:
    k8s_cfg = config.training.kubernetes
    timeout = int(k8s_cfg.startup_timeout.total_seconds())
    return {
        "task_id": task_id,
        "kubernetes_conn_id": k8s_cfg.kubernetes_conn_id,
        "namespace": k8s_cfg.namespace,
        "name": name,
        "random_name_suffix": False,  # the name is per try already; the Job's pods' DNS names depend on it
        # Without try_number: the operator adds the try's own, and looks up pods of earlier tries
        # (reattach) by the remaining labels.
        "labels": {key: value for key, value in labels.items() if key != "try_number"},
        "base_container_name": CONTAINER,
        "get_logs": True,
        "log_formatter": watcher.log_formatter,
        "startup_timeout_seconds": timeout,
        "schedule_timeout_seconds": timeout,
        "termination_message_policy": "FallbackToLogsOnError",  # the last log lines say why it died
        # on_kill deletes the pod with this grace: the ranks checkpoint before the kubelet's SIGKILL.
        "termination_grace_period": config.training.checkpoint.termination_grace_s,
        "log_events_on_failure": True,
        # The pod spec holds no secret values (Secrets are references), so logging it is safe.
        "log_pod_spec_on_failure": True,
    }


def _without_namespace(manifest: dict) -> dict:
    # With no namespace in the config, the operator picks the connection's, or in-cluster, one.
    metadata = {k: v for k, v in manifest["metadata"].items() if k != "namespace"}
    return {**manifest, "metadata": metadata}


class QueuedPodOperator(KubernetesPodOperator):
    """The pod operator of a Pod that Kueue queues: it waits for Kueue's admission before the
    provider's startup wait, so the schedule timeout counts from admission, not from creation."""

    def await_pod_start(self, pod: k8s.V1Pod) -> None:
        namespace = pod.metadata.namespace
        _await_admission(
            lambda: _pod_admitted(self, pod),
            f"Pod {namespace}/{pod.metadata.name}",
            namespace,
            self.labels[QUEUE_LABEL],
            self.log,
        )
        super().await_pod_start(pod)


def _pod_admitted(operator: KubernetesPodOperator, pod: k8s.V1Pod) -> bool:
    remote = operator.pod_manager.read_pod(pod)
    if (remote.status and remote.status.phase) not in (None, "Pending"):
        return True  # running or already over: the provider's wait takes it from here
    gates = (remote.spec and remote.spec.scheduling_gates) or []
    return not any(gate.name.startswith(KUEUE_GATE_PREFIX) for gate in gates)


def pod_operator(
    spec: TrainSpec, labels: RunLabels, task_id: str, watcher: JobWatcher
) -> KubernetesPodOperator:
    config = spec.config
    manifest = pod_manifest(spec, labels, config.training.kubernetes.namespace or "default")
    if config.training.kubernetes.namespace is None:
        manifest = _without_namespace(manifest)
    operator_class = KubernetesPodOperator if config.training.kubernetes.queue is None else QueuedPodOperator
    return operator_class(
        pod_template_dict=manifest,
        durable=True,
        on_finish_action="delete_succeeded_pod",  # a failed pod stays for `kubectl describe`
        **_common(config, task_id, watcher, manifest["metadata"]["name"], manifest["metadata"]["labels"]),
    )


def job_operator(
    spec: TrainSpec, labels: RunLabels, task_id: str, watcher: JobWatcher
) -> KubernetesJobOperator:
    config = spec.config
    manifest = job_manifest(spec, labels, config.training.kubernetes.namespace or "default")
    job_spec = manifest["spec"]
    pod_template = {"metadata": job_spec["template"]["metadata"], "spec": job_spec["template"]["spec"]}
    # Fields the operator has no parameter for (successPolicy) come in through full_job_spec; its
    # pod template stays empty, since the operator would concatenate the two templates' lists.
    extra = {
        k: v
        for k, v in job_spec.items()
        if k
        not in (
            "template",
            "completionMode",
            "completions",
            "parallelism",
            "backoffLimit",
            "ttlSecondsAfterFinished",
            "suspend",
        )
    }
    full_job_spec = to_model({"spec": {**extra, "template": {}}}, "V1Job") if extra else None
    return KubernetesJobOperator(
        pod_template_dict=pod_template,
        full_job_spec=full_job_spec,
        completion_mode="Indexed",
        completions=job_spec["completions"],
        parallelism=job_spec["parallelism"],
        backoff_limit=job_spec["backoffLimit"],
        ttl_seconds_after_finished=job_spec["ttlSecondsAfterFinished"],
        suspend=job_spec.get("suspend"),  # True with a Kueue queue: Kueue unsuspends it on admission
        wait_until_job_complete=True,
        on_finish_action="delete_succeeded_pod",
        **_common(
            config,
            task_id,
            watcher,
            manifest["metadata"]["name"].removeprefix(JOB_NAME_PREFIX),
            manifest["metadata"]["labels"],
        ),
    )


def aws_environment(conn_id: str) -> dict[str, str]:
    """The standard AWS variables for an Airflow AWS connection (s3fs and boto read them)."""
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
    credentials = hook.get_credentials()
    env = {"AWS_ACCESS_KEY_ID": credentials.access_key, "AWS_SECRET_ACCESS_KEY": credentials.secret_key}
    if credentials.token:
        env["AWS_SESSION_TOKEN"] = credentials.token
    if hook.region_name:
        env["AWS_DEFAULT_REGION"] = hook.region_name
    if endpoint := hook.conn_config.get_service_endpoint_url("s3"):
        env["AWS_ENDPOINT_URL"] = endpoint
    return env


def apply_connection_secret(
    operator: KubernetesPodOperator,
    config: PipelineConfig,
    labels: RunLabels,
    namespace: str,
    log: Any,
    extra_env: dict[str, str] | None = None,
) -> str | None:
    """Put this try's connection credentials (and `extra_env`, e.g. a trial's study storage URL)
    into the Secret its pods reference by name."""
    conn_id = config.training.kubernetes.aws_conn_id
    if conn_id is None and not extra_env:
        return None
    for earlier in operator.client.list_namespaced_secret(
        namespace=namespace, label_selector=_task_selector(labels)
    ).items:
        if (earlier.metadata.labels or {}).get("try_number") != str(labels.try_number):
            _delete_secret(operator, namespace, earlier.metadata.name)
    values = {**(aws_environment(conn_id) if conn_id else {}), **(extra_env or {})}
    body = connection_secret(config, labels, namespace, values)
    name = body["metadata"]["name"]
    try:
        operator.client.create_namespaced_secret(namespace=namespace, body=body)
    except ApiException as exc:
        if exc.status != 409:  # the same try again (a reattached worker): refresh it
            raise
        operator.client.replace_namespaced_secret(name=name, namespace=namespace, body=body)
    log.info(
        "credentials of %s are in Secret %s/%s for this try's pods",
        ", ".join([*([f"Airflow connection {conn_id}"] if conn_id else []), *sorted(extra_env or {})]),
        namespace,
        name,
    )
    return name


def _delete_secret(operator: KubernetesPodOperator, namespace: str, name: str) -> None:
    try:
        operator.client.delete_namespaced_secret(name=name, namespace=namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _task_selector(labels: RunLabels) -> str:
    return f"dag_id={label_value(labels.dag_id)},task_id={label_value(labels.task_id)},run_id={label_value(labels.run_id)}"


def run_pod(
    operator: KubernetesPodOperator,
    config: PipelineConfig,
    labels: RunLabels,
    context: Any,
    log: Any,
    extra_env: dict[str, str] | None = None,
) -> None:
    operator.pod_request_obj = operator.build_pod_request_obj(context)  # execute_sync uses it
    namespace = operator.pod_request_obj.metadata.namespace
    secret = apply_connection_secret(operator, config, labels, namespace, log, extra_env)
    try:
        # execute_sync is what KubernetesPodOperator.execute runs when not deferrable; calling it
        # directly keeps the reattach logic and avoids nesting another operator's execute().
        operator.execute_sync(context)
    finally:
        if secret:  # the container read it when it started
            _delete_secret(operator, namespace, secret)


def run_job(
    operator: KubernetesJobOperator,
    config: PipelineConfig,
    labels: RunLabels,
    context: Any,
    log: Any,
    extra_env: dict[str, str] | None = None,
) -> None:
    job = operator.build_job_request_obj(context)
    namespace = job.metadata.namespace
    _delete_earlier_tries(operator, namespace, labels, log)
    secret = apply_connection_secret(operator, config, labels, namespace, log, extra_env)
    try:
        _run_job(operator, config, labels, job, log)
    finally:
        if secret:
            _delete_secret(operator, namespace, secret)


def _run_job(
    operator: KubernetesJobOperator, config: PipelineConfig, labels: RunLabels, job: k8s.V1Job, log: Any
) -> None:
    namespace, name = job.metadata.namespace, job.metadata.name
    created = operator.hook.create_job(job=job)
    operator.job = job  # on_kill deletes it
    service = service_manifest(config, labels, namespace, name)
    service["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": name,
            "uid": created.metadata.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]
    operator.client.create_namespaced_service(namespace=namespace, body=service)
    log.info("created Job %s/%s (%d pods) and its headless Service", namespace, name, job.spec.parallelism)
    job_failed = False
    try:
        if job.spec.suspend:
            _await_admission(
                lambda: _job_admitted(operator, namespace, name),
                f"Job {namespace}/{name}",
                namespace,
                config.training.kubernetes.queue or "",
                log,
            )
        leader = _leader_pod(
            operator, namespace, name, int(config.training.kubernetes.startup_timeout.total_seconds())
        )
        asyncio.run(
            operator.pod_manager.await_pod_start(
                pod=leader,
                schedule_timeout=operator.schedule_timeout_seconds,
                startup_timeout=operator.startup_timeout_seconds,
                check_interval=operator.startup_check_interval_seconds,
            )
        )
        operator.pod_manager.fetch_requested_container_logs(
            pod=leader,
            containers=CONTAINER,
            follow_logs=True,
            log_formatter=operator.log_formatter,
        )
        finished = operator.hook.wait_until_job_complete(
            job_name=name, namespace=namespace, job_poll_interval=operator.job_poll_interval
        )
        if error := operator.hook.is_job_failed(job=finished):
            job_failed = True
            raise TrainingJobError(f"Kubernetes Job {namespace}/{name} failed: {error}")
    finally:
        # A failed Job stays for `kubectl describe` (its pods are stopped; the TTL or the next
        # try removes it); a finished one, or one this task stops watching (timeout, error),
        # goes now, with its Service (ownerReferences).
        if not job_failed:
            _delete_job(operator, namespace, name)


def _await_admission(admitted: Callable[[], bool], what: str, namespace: str, queue: str, log: Any) -> None:
    """Wait until Kueue admits `what` from LocalQueue `queue`.

    No deadline here: waiting in the queue is what a queue is for (behind other teams' jobs, or
    until quota frees up, for hours), and no pod exists yet, so `startup_timeout`, which bounds
    waiting for a node and an image, starts after admission, in the provider's pod wait and in
    _leader_pod as without a queue. What bounds the whole try is the task's `execution_timeout`;
    when Airflow stops the task, on_kill deletes the queued Job or Pod, which leaves the queue.
    """
    started = last_log = time.monotonic()
    log.info("%s waits in Kueue LocalQueue %s until Kueue admits it", what, queue)
    while not admitted():
        if time.monotonic() - last_log >= ADMISSION_LOG_EVERY_S:
            last_log = time.monotonic()
            log.info(
                "%s still waits in Kueue LocalQueue %s after %.0fs (`kubectl get workloads -n %s` says why)",
                what,
                queue,
                last_log - started,
                namespace,
            )
        time.sleep(ADMISSION_POLL_S)
    log.info("Kueue admitted %s after %.0fs", what, time.monotonic() - started)


def _job_admitted(operator: KubernetesJobOperator, namespace: str, name: str) -> bool:
    """Kueue admits a Job by unsuspending it; a Job deleted or failed while queued ends the try."""
    try:
        job = operator.job_client.read_namespaced_job(name=name, namespace=namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise TrainingJobError(f"Job {namespace}/{name} was deleted before Kueue admitted it") from exc
        raise
    if error := operator.hook.is_job_failed(job=job):
        raise TrainingJobError(f"Kubernetes Job {namespace}/{name} failed before Kueue admitted it: {error}")
    return not job.spec.suspend


def _leader_pod(operator: KubernetesJobOperator, namespace: str, job_name: str, timeout_s: int) -> k8s.V1Pod:
    selector = f"batch.kubernetes.io/job-name={job_name},batch.kubernetes.io/job-completion-index=0"
    deadline = time.monotonic() + timeout_s
    while True:
        pods = operator.client.list_namespaced_pod(namespace=namespace, label_selector=selector).items
        if pods:
            return pods[0]
        if time.monotonic() > deadline:
            raise TrainingJobError(f"no pod of Job {namespace}/{job_name} appeared within {timeout_s}s")
        time.sleep(2)


def _delete_earlier_tries(
    operator: KubernetesJobOperator, namespace: str, labels: RunLabels, log: Any
) -> None:
    """A worker that died mid-try leaves its Job training; two Jobs must never share a run directory."""
    for job in operator.job_client.list_namespaced_job(
        namespace=namespace, label_selector=_task_selector(labels)
    ).items:
        if (job.metadata.labels or {}).get("try_number") != str(labels.try_number):
            log.warning(
                "deleting Job %s/%s left by try %s",
                namespace,
                job.metadata.name,
                job.metadata.labels.get("try_number"),
            )
            _delete_job(operator, namespace, job.metadata.name)
            _wait_gone(operator, namespace, job.metadata.name)


def _wait_gone(operator: KubernetesJobOperator, namespace: str, name: str, timeout_s: float = 300) -> None:
    # Foreground deletion removes the Job only after its pods are gone, so their last
    # checkpoint writes are over before the new Job starts.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            operator.job_client.read_namespaced_job(name=name, namespace=namespace)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(2)
    raise TrainingJobError(
        f"Job {namespace}/{name} of an earlier try is still terminating after {timeout_s:.0f}s"
    )


def _delete_job(operator: KubernetesJobOperator, namespace: str, name: str) -> None:
    try:
        operator.job_client.delete_namespaced_job(
            name=name, namespace=namespace, propagation_policy="Foreground"
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
