"""The cncf.kubernetes operators built for a training try, and the cluster-side decisions that need no cluster."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest
from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.pod_generator import make_safe_label_value
from kubernetes.client import models as k8s
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
