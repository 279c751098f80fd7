"""The cncf.kubernetes operators built for a training try, and the cluster-side decisions that need no cluster."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.pod_generator import make_safe_label_value
from kubernetes.client import models as k8s
from kubernetes.client.rest import ApiException
from urllib3.exceptions import MaxRetryError

from airflow_trainpipe.config import PipelineConfig, parse_config
from airflow_trainpipe.contracts.events import PREFIX
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.core.exceptions import TrainingJobError
from airflow_trainpipe.launchers import kubernetes_cluster as cluster
from airflow_trainpipe.launchers.kubernetes_manifests import RunLabels, job_manifest, pod_manifest
from airflow_trainpipe.launchers.watcher import JobWatcher
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.kubernetes import RUN_ID, task_context

LABELS = RunLabels("house_prices", "train", RUN_ID, 3)
ONE_NODE = {"    nodes: 2\n": "    nodes: 1\n", "    min_nodes: 1 ": "    # min_nodes: 1 "}
STATIC = {"    min_nodes: 1 ": "    # min_nodes: 1 "}
NO_NAMESPACE = {"    namespace: ml-training\n": ""}
LOG = logging.getLogger(__name__)


def _config(*edits: dict[str, str]) -> PipelineConfig:
    """house_prices.yaml (two nodes, elastic, namespace ml-training) with text replacements."""
    text = (EXAMPLE_CONFIGS / "house_prices.yaml").read_text()
    for edit in edits:
        for old, new in edit.items():
            assert old in text, old
            text = text.replace(old, new)
    return parse_config(text)


def _spec(config: PipelineConfig) -> TrainSpec:
    return TrainSpec(
        config=config, run_id=RUN_ID, data_files=["s3://ml-data/house-sales/week=2026-01-05/part-0.csv"]
    )


def _pod(config: PipelineConfig, watcher: JobWatcher | None = None) -> KubernetesPodOperator:
    return cluster.pod_operator(_spec(config), LABELS, "train", watcher or JobWatcher())


def _job(config: PipelineConfig, watcher: JobWatcher | None = None) -> KubernetesJobOperator:
    return cluster.job_operator(_spec(config), LABELS, "train", watcher or JobWatcher())


@pytest.fixture(scope="module")
def one_node() -> PipelineConfig:
    return _config(ONE_NODE)


@pytest.fixture(scope="module")
def elastic() -> PipelineConfig:
    return _config()


def test_to_model_maps_a_manifest_onto_the_client_s_models(elastic: PipelineConfig) -> None:
    job = cluster.to_model(job_manifest(_spec(elastic), LABELS, "ml-training"), "V1Job")
    assert isinstance(job, k8s.V1Job)
    assert (job.spec.completion_mode, job.spec.ttl_seconds_after_finished) == ("Indexed", 3600)
    assert job.spec.success_policy.rules[0].succeeded_indexes == "0"
    container = job.spec.template.spec.containers[0]
    assert container.name == "base" and container.resources.limits["nvidia.com/gpu"] == "4"
    assert job.spec.template.spec.node_selector["karpenter.sh/capacity-type"] == "spot"


def test_the_pod_operator_waits_as_long_as_the_config_allows_and_keeps_failed_pods(
    one_node: PipelineConfig,
) -> None:
    operator = _pod(one_node)
    assert (operator.startup_timeout_seconds, operator.schedule_timeout_seconds) == (600, 600)  # default 10m
    assert operator.on_finish_action.value == "delete_succeeded_pod"
    assert operator.termination_message_policy == "FallbackToLogsOnError"
    assert operator.log_events_on_failure and operator.log_pod_spec_on_failure
    assert operator.get_logs and operator.base_container_name == "base" and operator.task_id == "train"
    # on_kill deletes the pod with the grace the ranks need to checkpoint, as the pod spec says.
    assert operator.termination_grace_period == 40 == one_node.training.checkpoint.termination_grace_s


def test_a_configured_startup_timeout_bounds_scheduling_and_startup() -> None:
    operator = _pod(
        _config(ONE_NODE, {"    shm_size: 16Gi\n": "    shm_size: 16Gi\n    startup_timeout: 2m\n"})
    )
    assert (operator.startup_timeout_seconds, operator.schedule_timeout_seconds) == (120, 120)


def test_the_pod_operator_carries_the_rendered_pod_under_its_per_try_name(one_node: PipelineConfig) -> None:
    operator = _pod(one_node)
    manifest = pod_manifest(_spec(one_node), LABELS, "ml-training")
    assert operator.pod_template_dict == manifest
    assert operator.name == LABELS.workload_name() == manifest["metadata"]["name"]
    assert operator.labels == {k: v for k, v in manifest["metadata"]["labels"].items() if k != "try_number"}
    assert operator.labels["trainpipe/pipeline"] == "house_prices"


def test_without_a_namespace_the_pod_leaves_it_to_the_connection() -> None:
    config = _config(ONE_NODE, NO_NAMESPACE)
    operator = _pod(config)
    assert operator.namespace is None
    metadata = operator.pod_template_dict["metadata"]
    assert "namespace" not in metadata
    assert metadata["name"] == LABELS.workload_name() and metadata["labels"]["try_number"] == "3"


@pytest.mark.parametrize("build", [_pod, _job], ids=["pod", "job"])
def test_the_job_s_log_lines_feed_the_watcher(
    build: Callable[[PipelineConfig, JobWatcher], KubernetesPodOperator], one_node: PipelineConfig
) -> None:
    watcher = JobWatcher()
    operator = build(one_node if build is _pod else _config(), watcher)
    error = PREFIX + json.dumps({"event": "error", "rank": 5, "error": "CUDA OOM", "retryable": False})
    assert operator.log_formatter("base", error) == "training failed on rank 5: CUDA OOM"
    assert operator.log_formatter("base", "[rank5] traceback") == "[rank5] traceback"
    assert watcher.errors == ["rank 5: CUDA OOM"] and watcher.final
    assert list(watcher.tail) == ["[rank5] traceback"]


def test_the_job_operator_runs_an_indexed_job_of_one_pod_per_node(elastic: PipelineConfig) -> None:
    operator = _job(elastic)
    # The operator prepends "job-" itself: given the bare per-try name, it names the Job as rendered.
    assert operator.name == LABELS.workload_name()
    assert (operator.completion_mode, operator.completions, operator.parallelism) == ("Indexed", 2, 2)
    assert (operator.backoff_limit, operator.ttl_seconds_after_finished) == (0, 3600)
    assert operator.wait_until_job_complete and operator.on_finish_action.value == "delete_succeeded_pod"
    assert set(operator.pod_template_dict) == {"metadata", "spec"}
    assert operator.pod_template_dict["spec"]["subdomain"] == f"job-{LABELS.workload_name()}"
    assert operator.termination_grace_period == 40
    assert operator.pod_template_dict["spec"]["terminationGracePeriodSeconds"] == 40


def test_only_the_elastic_job_passes_a_success_policy_through_the_full_job_spec(
    elastic: PipelineConfig,
) -> None:
    full = _job(elastic).full_job_spec
    assert full.spec.success_policy.rules[0].succeeded_indexes == "0"
    # An empty template: the operator would concatenate its lists with pod_template_dict's.
    assert (full.spec.template.metadata, full.spec.template.spec) == (None, None)
    assert full.spec.completions is None and full.spec.backoff_limit is None
    assert _job(_config(STATIC)).full_job_spec is None


def test_aws_environment_passes_a_session_token_and_leaves_out_what_is_not_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(
        "AIRFLOW_CONN_TEMP_AWS",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "ASIAKEY",
                "password": "secret",
                "extra": {"aws_session_token": "tok"},
            }
        ),
    )
    assert cluster.aws_environment("temp_aws") == {
        "AWS_ACCESS_KEY_ID": "ASIAKEY",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "tok",
    }


def test_the_cleanup_selector_finds_every_try_of_the_task_instance() -> None:
    expected = f"dag_id=house_prices,task_id=train,run_id={make_safe_label_value(RUN_ID)}"
    assert cluster._task_selector(LABELS) == expected
    assert cluster._task_selector(RunLabels("house_prices", "train", RUN_ID, 1)) == expected


def test_without_an_aws_connection_no_secret_is_made(one_node: PipelineConfig) -> None:
    # No cluster is configured here: any API call would raise instead of returning None.
    assert cluster.apply_connection_secret(_pod(one_node), one_node, LABELS, "ml-training", LOG) is None


def test_an_earlier_try_s_job_that_does_not_go_away_fails_the_try_naming_it(elastic: PipelineConfig) -> None:
    with pytest.raises(
        TrainingJobError, match=r"^Job ml-training/job-old-2 of an earlier try is still terminating after 0s$"
    ):
        cluster._wait_gone(_job(elastic), "ml-training", "job-old-2", timeout_s=0)


@pytest.mark.usefixtures("kubeconfig")
def test_a_job_try_first_lists_the_jobs_of_all_earlier_tries(elastic: PipelineConfig) -> None:
    operator = _job(elastic)
    # The API server is not there: the first request made is the one that fails.
    with pytest.raises(MaxRetryError) as caught:
        cluster.run_job(operator, elastic, LABELS, task_context(try_number=3), LOG)
    url = str(caught.value.url)
    assert url.startswith("/apis/batch/v1/namespaces/ml-training/jobs?labelSelector=")
    assert "dag_id%3Dhouse_prices%2Ctask_id%3Dtrain%2Crun_id%3D" in url and "try_number" not in url


# -- Kueue (training.kubernetes.queue) -------------------------------------------------------------

QUEUED = {"    shm_size: 16Gi\n": "    shm_size: 16Gi\n    queue: ml-gpu\n"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@pytest.mark.usefixtures("kubeconfig")
def test_a_queued_job_is_created_suspended_with_the_queue_label_on_it_and_its_pods() -> None:
    operator = _job(_config(QUEUED))
    job = operator.build_job_request_obj(task_context(try_number=3))
    assert operator.suspend is True and job.spec.suspend is True
    assert job.metadata.labels[QUEUE_LABEL] == job.spec.template.metadata.labels[QUEUE_LABEL] == "ml-gpu"
    # suspend is the operator's own parameter, not a full_job_spec field.
    assert operator.full_job_spec.spec.suspend is None
    assert _job(_config(QUEUED, STATIC)).full_job_spec is None
    unqueued = _job(_config()).build_job_request_obj(task_context(try_number=3))
    assert unqueued.spec.suspend is None and QUEUE_LABEL not in unqueued.metadata.labels


def test_a_queued_pod_carries_the_queue_label_and_waits_for_admission() -> None:
    operator = _pod(_config(ONE_NODE, QUEUED))
    assert isinstance(operator, cluster.QueuedPodOperator)
    assert operator.labels[QUEUE_LABEL] == "ml-gpu"
    assert operator.pod_template_dict["metadata"]["labels"][QUEUE_LABEL] == "ml-gpu"
    assert type(_pod(_config(ONE_NODE))) is KubernetesPodOperator


class _Clock:
    """time.monotonic and time.sleep of kubernetes_cluster: sleeping advances the clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _FakeCluster:
    """The API calls of a try (the operator's hook, client, job_client and pod_manager) on a
    cluster whose Kueue admits the workload `queued_s` seconds after it is created."""

    is_job_failed = staticmethod(KubernetesHook.is_job_failed)

    def __init__(self, clock: _Clock, queued_s: float, pods_after_admission: bool = True):
        self.clock, self.queued_s, self.pods_after_admission = clock, queued_s, pods_after_admission
        self.calls: list[tuple[str, float]] = []
        self.deleted = False

    def _call(self, name: str) -> None:
        self.calls.append((name, self.clock.now))

    def admitted(self) -> bool:
        return self.clock.now >= self.queued_s

    # hook
    def create_job(self, job: k8s.V1Job) -> k8s.V1Job:
        self._call("create_job")
        assert job.spec.suspend is True  # created suspended: no pod before Kueue admits it
        return k8s.V1Job(metadata=k8s.V1ObjectMeta(name=job.metadata.name, uid="uid-1"))

    def wait_until_job_complete(self, job_name: str, namespace: str, job_poll_interval: float) -> k8s.V1Job:
        self._call("wait_until_job_complete")
        return k8s.V1Job(
            status=k8s.V1JobStatus(conditions=[k8s.V1JobCondition(type="Complete", status="True")])
        )

    # job_client
    def read_namespaced_job(self, name: str, namespace: str) -> k8s.V1Job:
        self._call("read_namespaced_job")
        if self.deleted:
            raise ApiException(status=404)
        spec = k8s.V1JobSpec(suspend=not self.admitted(), template=k8s.V1PodTemplateSpec())
        return k8s.V1Job(metadata=k8s.V1ObjectMeta(name=name), spec=spec)

    def delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str) -> None:
        self._call("delete_namespaced_job")

    # client
    def create_namespaced_service(self, namespace: str, body: dict) -> None:
        self._call("create_namespaced_service")

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> k8s.V1PodList:
        self._call("list_namespaced_pod")
        exists = self.admitted() and self.pods_after_admission
        leader = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="leader", namespace=namespace))
        return k8s.V1PodList(items=[leader] if exists else [])

    # pod_manager
    def read_pod(self, pod: k8s.V1Pod) -> k8s.V1Pod:
        self._call("read_pod")
        gates = [] if self.admitted() else [k8s.V1PodSchedulingGate(name="kueue.x-k8s.io/admission")]
        return k8s.V1Pod(
            metadata=pod.metadata,
            spec=k8s.V1PodSpec(containers=[], scheduling_gates=gates),
            status=k8s.V1PodStatus(phase="Pending"),
        )

    async def await_pod_start(self, pod: k8s.V1Pod, **timeouts: float) -> None:
        self._call("await_pod_start")
        self.timeouts = timeouts

    async def watch_pod_events(self, pod: k8s.V1Pod, check_interval: float) -> None:
        return None

    def fetch_requested_container_logs(self, pod: k8s.V1Pod, **kwargs: object) -> None:
        self._call("fetch_requested_container_logs")


def _faked(operator: KubernetesPodOperator, fake: _FakeCluster) -> None:
    for name in ("hook", "client", "job_client", "pod_manager"):
        setattr(operator, name, fake)  # the operator's cached API objects


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(cluster, "time", clock)
    return clock


@pytest.mark.usefixtures("kubeconfig")
def test_an_hour_in_the_kueue_queue_is_no_stuck_job_and_startup_timeout_counts_from_admission(
    clock: _Clock, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(QUEUED)
    operator = _job(config)
    fake = _FakeCluster(clock, queued_s=3600)  # six times startup_timeout (10m)
    job = operator.build_job_request_obj(task_context(try_number=3))
    _faked(operator, fake)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        cluster._run_job(operator, config, LABELS, job, LOG)
    when = dict(reversed(fake.calls))  # each call's first time
    assert when["create_job"] == 0 and when["list_namespaced_pod"] == 3600
    names = [name for name, _ in fake.calls]
    # Pods are looked for only once Kueue unsuspended the Job, then followed as without a queue.
    assert names.index("list_namespaced_pod") > names.index("read_namespaced_job")
    assert names[-4:] == [
        "await_pod_start",
        "fetch_requested_container_logs",
        "wait_until_job_complete",
        "delete_namespaced_job",
    ]
    assert fake.timeouts["schedule_timeout"] == fake.timeouts["startup_timeout"] == 600
    messages = [r.getMessage() for r in caplog.records]
    name = job.metadata.name
    assert f"Job ml-training/{name} waits in Kueue LocalQueue ml-gpu until Kueue admits it" in messages
    assert f"Kueue admitted Job ml-training/{name} after 3600s" in messages
    still = [m for m in messages if "still waits in Kueue LocalQueue ml-gpu" in m]
    assert len(still) == 11 and "`kubectl get workloads -n ml-training` says why" in still[0]


@pytest.mark.usefixtures("kubeconfig")
def test_after_admission_the_startup_timeout_still_bounds_a_job_whose_pods_never_come(clock: _Clock) -> None:
    config = _config(QUEUED)
    operator = _job(config)
    fake = _FakeCluster(clock, queued_s=3600, pods_after_admission=False)
    job = operator.build_job_request_obj(task_context(try_number=3))
    _faked(operator, fake)
    with pytest.raises(TrainingJobError, match=r"^no pod of Job ml-training/job-\S+ appeared within 600s$"):
        cluster._run_job(operator, config, LABELS, job, LOG)
    assert 4200 <= clock.now < 4210  # an hour in the queue, then the 10 minutes of startup_timeout
    assert fake.calls[-1][0] == "delete_namespaced_job"  # the Job it stops watching goes


@pytest.mark.usefixtures("kubeconfig")
def test_a_job_deleted_while_queued_ends_the_try_naming_it(clock: _Clock) -> None:
    config = _config(QUEUED)
    operator = _job(config)
    fake = _FakeCluster(clock, queued_s=3600)
    fake.deleted = True
    job = operator.build_job_request_obj(task_context(try_number=3))
    _faked(operator, fake)
    with pytest.raises(
        TrainingJobError, match=r"^Job ml-training/job-\S+ was deleted before Kueue admitted it$"
    ):
        cluster._run_job(operator, config, LABELS, job, LOG)


def test_a_queued_pod_s_startup_wait_begins_when_kueue_lifts_its_scheduling_gate(clock: _Clock) -> None:
    operator = _pod(_config(ONE_NODE, QUEUED))
    fake = _FakeCluster(clock, queued_s=3600)
    _faked(operator, fake)
    pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name=LABELS.workload_name(), namespace="ml-training"))
    operator.await_pod_start(pod)
    reads = [t for name, t in fake.calls if name == "read_pod"]
    assert reads[0] == 0 and reads[-1] == 3600  # gated for an hour: polled, not timed out
    # The provider's wait (schedule and startup timeouts) starts only then.
    assert fake.calls[-1] == ("await_pod_start", 3600)
    assert fake.timeouts["schedule_timeout"] == fake.timeouts["startup_timeout"] == 600
