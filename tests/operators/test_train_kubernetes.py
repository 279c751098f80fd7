"""DistributedTrainOperator with `launcher: kubernetes`, as far as it goes without a cluster: the
KubernetesPodOperator / KubernetesJobOperator it builds, the Pod and Job objects those operators
would submit (validated like the rendered manifests), and a try against an API server that is
not there."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_trainpipe.operators.train import DistributedTrainOperator
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.kubernetes import task_context

DATA = ["s3://ml-data/house-sales/week=2026-01-05/part-0.csv"]
SINGLE_NODE = "    nodes: 1\n"


def _config_file(tmp_path: Path, nodes: int) -> str:
    text = (EXAMPLE_CONFIGS / "house_prices.yaml").read_text()
    if nodes == 1:
        text = text.replace("    nodes: 2\n", SINGLE_NODE).replace("    min_nodes: 1 ", "    # min_nodes: 1 ")
    path = tmp_path / "house_prices.yaml"
    path.write_text(text)
    return str(path)


def _operator(tmp_path: Path, nodes: int) -> DistributedTrainOperator:
    from airflow.sdk import DAG

    with DAG("house_prices", schedule=None, start_date=datetime(2026, 1, 1)):
        return DistributedTrainOperator(
            task_id="train", config=_config_file(tmp_path, nodes), data_files=DATA
        )


def _validate(tmp_path: Path, documents: list[dict]) -> None:
    path = tmp_path / "submitted.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    cli = Path(sys.executable).with_name("kubernetes-validate")
    for version in ("1.30.0", "1.31.0", "1.32.0", "1.33.0"):
        done = subprocess.run(
            [str(cli), "--strict", "-k", version, str(path)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr


def _serialize(model: Any) -> dict:
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(model)


def test_one_node_is_a_durable_kubernetes_pod_operator(tmp_path: Path) -> None:
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    operator = _operator(tmp_path, nodes=1)
    context = task_context()
    pod_operator = operator.kubernetes_operator(context, operator._spec(store=None, context={}))
    assert type(pod_operator) is KubernetesPodOperator
    assert pod_operator.durable is True and pod_operator.reattach_on_restart is True
    assert pod_operator.namespace == "ml-training" and pod_operator.kubernetes_conn_id == "kubernetes_default"
    assert pod_operator.random_name_suffix is False and pod_operator.name.endswith("-2")
    assert (
        "pod_template_dict" in pod_operator.template_fields
        and pod_operator.pod_template_dict["kind"] == "Pod"
    )

    pod = _serialize(pod_operator.build_pod_request_obj(context, dry_run=True))
    labels = pod["metadata"]["labels"]
    assert {k: labels[k] for k in ("dag_id", "task_id", "try_number", "kubernetes_pod_operator")} == {
        "dag_id": "house_prices",
        "task_id": "train",
        "try_number": "2",
        "kubernetes_pod_operator": "True",
    }
    (container,) = pod["spec"]["containers"]
    assert container["command"] == pod_operator.pod_template_dict["spec"]["containers"][0]["command"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["priorityClassName"] == "ml-batch" and pod["spec"]["restartPolicy"] == "Never"
    # Nothing of the rendered manifest is lost or overridden on the way through the operator.
    assert _pruned(pod["spec"]) == _pruned(pod_operator.pod_template_dict["spec"])
    _validate(tmp_path, [pod])


def _pruned(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _pruned(v)
            for k, v in value.items()
            if v not in (None, [], {}, False)
            or k
            in ("readOnly", "allowPrivilegeEscalation", "automountServiceAccountToken", "enableServiceLinks")
        }
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def test_dry_run_prints_the_pod(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    operator = _operator(tmp_path, nodes=1)
    operator.kubernetes_operator(task_context(), operator._spec(store=None, context={})).dry_run()
    out = capsys.readouterr().out.splitlines()
    # The operator's "Building pod" log line may share stdout; the YAML document follows it.
    pod = yaml.safe_load(
        "\n".join(out[next(i for i, line in enumerate(out) if line.startswith("api_version:")) :])
    )
    assert pod["kind"] == "Pod" and pod["spec"]["containers"][0]["name"] == "base"
    assert {"name": "dshm", "empty_dir": {"medium": "Memory", "size_limit": "16Gi"}} in pod["spec"]["volumes"]


def test_several_nodes_are_an_indexed_job(tmp_path: Path, kubeconfig: str) -> None:
    from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator

    operator = _operator(tmp_path, nodes=2)
    context = task_context()
    job_operator = operator.kubernetes_operator(context, operator._spec(store=None, context={}))
    assert type(job_operator) is KubernetesJobOperator
    job = _serialize(job_operator.build_job_request_obj(context))
    name = job["metadata"]["name"]
    assert name.startswith("job-house-prices-") and name.endswith("-2")
    assert job["metadata"]["namespace"] == "ml-training"
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == (
        "Indexed",
        2,
        2,
    )
    assert job["spec"]["successPolicy"] == {
        "rules": [{"succeededIndexes": "0"}]
    }  # came in through full_job_spec
    template = job["spec"]["template"]
    assert template["metadata"]["labels"]["try_number"] == "2"
    assert template["spec"]["subdomain"] == name  # the headless Service's name: <job>-0.<job> is rank 0
    command = template["spec"]["containers"][0]["command"]
    assert f"{name}-0.{name}:29500" in command
    assert _pruned(template["spec"]) == _pruned(job_operator.pod_template_dict["spec"])
    _validate(tmp_path, [job])


def test_a_try_without_a_reachable_cluster_fails_retryably_and_names_the_cause(
    tmp_path: Path, kubeconfig: str
) -> None:
    from airflow_trainpipe.core.exceptions import TrainingJobError

    operator = _operator(tmp_path, nodes=1)
    with pytest.raises(TrainingJobError, match=r"training on Kubernetes failed \(try 2\)") as caught:
        operator.execute(task_context())
    assert caught.value.retryable  # the retry policy retries it
    message = str(caught.value)
    assert (
        "Failed to establish a new connection" in message and "/api/v1/namespaces/ml-training/pods" in message
    )
    assert (
        "a retry starts new pods that resume from the newest complete checkpoint under s3://ml-checkpoints/trainpipe/house_prices/"
        in message
    )
    # Reattach looks for pods of any earlier try of this task instance, not only this try's.
    assert "try_number" not in message.split("labelSelector=")[1].split(" ")[0]


def test_the_example_s_pod_labels_find_earlier_tries(tmp_path: Path) -> None:
    operator = _operator(tmp_path, nodes=1)
    pod_operator = operator.kubernetes_operator(task_context(), operator._spec(store=None, context={}))
    assert "try_number" not in pod_operator.labels
    assert "try_number" not in pod_operator._build_find_pod_label_selector(task_context())


def test_connection_credentials_stay_out_of_the_pod_and_the_error(
    tmp_path: Path, kubeconfig: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_trainpipe.core.exceptions import TrainingJobError

    secret_value = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    monkeypatch.setenv(
        "AIRFLOW_CONN_TRAINPIPE_AWS",
        json.dumps({"conn_type": "aws", "login": "AKIAEXAMPLE", "password": secret_value}),
    )
    config = Path(_config_file(tmp_path, nodes=1))
    config.write_text(
        config.read_text().replace(
            "    shm_size: 16Gi\n", "    shm_size: 16Gi\n    aws_conn_id: trainpipe_aws\n"
        )
    )
    from airflow.sdk import DAG

    with DAG("house_prices", schedule=None, start_date=datetime(2026, 1, 1)):
        operator = DistributedTrainOperator(task_id="train", config=str(config), data_files=DATA)
    context = task_context()
    pod_operator = operator.kubernetes_operator(context, operator._spec(store=None, context={}))
    pod = _serialize(pod_operator.build_pod_request_obj(context, dry_run=True))
    assert pod["spec"]["containers"][0]["envFrom"] == [
        {"secretRef": {"name": pod["metadata"]["name"] + "-conn"}}
    ]
    assert secret_value not in json.dumps(pod)
    # The try reaches the API for the Secret first; nothing of the connection leaks into the error.
    with pytest.raises(TrainingJobError, match="/api/v1/namespaces/ml-training/secrets") as caught:
        operator.execute(context)
    assert secret_value not in str(caught.value) and "AKIAEXAMPLE" not in str(caught.value)


def test_each_tuning_trial_is_one_pod_through_its_rungs(tmp_path: Path) -> None:
    from airflow_trainpipe.config.tuning import TuningSection
    from airflow_trainpipe.tuning.outcomes import StudyRef
    from airflow_trainpipe.tuning.trials import rung_spec

    operator = _operator(tmp_path, nodes=1)
    context = task_context()
    base = operator._spec(store=None, context={})
    tuning = TuningSection.model_validate(
        {"space": {"learning_rate": {"type": "float", "low": 1e-4, "high": 0.1}}}
    )
    ref = StudyRef(study_name="house_prices:r1", storage="sqlite:///x", parent_run_id="p", run_id="r1")
    names, pods = set(), []
    for number in (0, 1):
        spec = rung_spec(
            base, ref, number, base.hyperparameters, tuning, 3, True, rungs=[1], trial_id=7 + number
        )
        pod_operator = operator.kubernetes_operator(context, spec)
        names.add(pod_operator.name)
        pods.append(_serialize(pod_operator.build_pod_request_obj(context, dry_run=True)))
    # Mapped task instances share the task id: each trial's pod is named after its trial.
    assert len(names) == 2
    container = pods[-1]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    spec = json.loads(env["TRAINPIPE_SPEC"])
    assert spec["trial"] == {
        "number": 1,
        "validation": {"fraction": 0.1, "seed": 0},  # data.validation (the default share)
        "final": True,
        "study_run_id": "r1",  # the trials of study r1 share its pretrained pin
        "rungs": [1],  # the pod reports rung 1 to the study and stops there when pruned
        "study_name": "house_prices:r1",
        "trial_id": 8,
        "budget": 20,  # the config's 20 epochs: the trial's learning-rate schedule spans them
    }
    assert spec["run_id"] == "r1.trial-001" and spec["hyperparameters"]["epochs"] == 3
    # The study's URL (it may hold a password) reaches the pod through the try's Secret only.
    assert container["envFrom"] == [{"secretRef": {"name": pods[-1]["metadata"]["name"] + "-conn"}}]
    assert "TRAINPIPE_OPTUNA_STORAGE" not in json.dumps(pods)
    _validate(tmp_path, pods[:1])


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_queued_try_submits_kueue_s_label_and_a_suspended_job(
    tmp_path: Path, kubeconfig: str, nodes: int
) -> None:
    config = Path(_config_file(tmp_path, nodes))
    config.write_text(
        config.read_text().replace("    shm_size: 16Gi\n", "    shm_size: 16Gi\n    queue: ml-gpu\n")
    )
    from airflow.sdk import DAG

    with DAG("house_prices", schedule=None, start_date=datetime(2026, 1, 1)):
        operator = DistributedTrainOperator(task_id="train", config=str(config), data_files=DATA)
    context = task_context()
    kubernetes_operator = operator.kubernetes_operator(context, operator._spec(store=None, context={}))
    if nodes == 1:
        submitted = _serialize(kubernetes_operator.build_pod_request_obj(context, dry_run=True))
        pod_labels = submitted["metadata"]["labels"]
        assert "suspend" not in submitted["spec"]  # Kueue gates a Pod instead
    else:
        submitted = _serialize(kubernetes_operator.build_job_request_obj(context))
        assert submitted["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "ml-gpu"
        assert submitted["spec"]["suspend"] is True
        pod_labels = submitted["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["kueue.x-k8s.io/queue-name"] == "ml-gpu" and pod_labels["try_number"] == "2"
    _validate(tmp_path, [submitted])
