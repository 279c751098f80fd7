"""The rendered manifests: valid Kubernetes 1.30-1.33 objects (kubernetes-validate --strict), with
the resources, volumes, security context and labels the config asks for, and no secret value."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from airflow_trainpipe.cli import main
from airflow_trainpipe.config import load_config, parse_config
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.launchers.kubernetes_manifests import (
    QUEUE_LABEL,
    RunLabels,
    container_command,
    label_value,
    manifests,
)
from tests.conftest import EXAMPLE_CONFIGS

KUBERNETES_VERSIONS = ("1.30.0", "1.31.0", "1.32.0", "1.33.0")
RUN_ID = "manual__2026-01-05T10:11:12.123456+00:00"  # ':', '+' and '.' are not label-safe
# What the cluster's Secrets would hold; the manifests may only name them.
SECRET_VALUES = ("AKIAEXAMPLEKEYVALUE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "mlflow-token-value-123")


def _single_node_config() -> str:
    text = (EXAMPLE_CONFIGS / "house_prices.yaml").read_text()
    text = text.replace("    nodes: 2\n", "    nodes: 1\n").replace(
        "    min_nodes: 1                          # on retry, resume on the nodes that can be had\n", ""
    )
    return text


def _queued(config_text: str, queue: str = "ml-gpu") -> str:
    """The config with `training.kubernetes.queue` (Kueue's LocalQueue) set."""
    assert "    shm_size: 16Gi\n" in config_text
    return config_text.replace("    shm_size: 16Gi\n", f"    shm_size: 16Gi\n    queue: {queue}\n")


def _render(config_text: str, try_number: int = 2) -> list[dict]:
    config = parse_config(config_text)
    spec = TrainSpec(
        config=config, run_id=RUN_ID, data_files=["s3://ml-data/house-sales/week=2026-01-05/part-0.csv"]
    )
    return manifests(spec, RunLabels(config.pipeline, "train", RUN_ID, try_number))


@pytest.fixture(scope="module")
def job_and_service() -> list[dict]:
    return _render((EXAMPLE_CONFIGS / "house_prices.yaml").read_text())


@pytest.fixture(scope="module")
def static_job() -> list[dict]:
    text = (EXAMPLE_CONFIGS / "house_prices.yaml").read_text()
    return _render(
        text.replace(
            "    min_nodes: 1                          # on retry, resume on the nodes that can be had\n", ""
        )
    )


@pytest.fixture(scope="module")
def pod() -> dict:
    (manifest,) = _render(_single_node_config())
    return manifest


@pytest.fixture(scope="module")
def queued_pod() -> dict:
    (manifest,) = _render(_queued(_single_node_config()))
    return manifest


@pytest.fixture(scope="module")
def queued_job() -> list[dict]:
    return _render(_queued((EXAMPLE_CONFIGS / "house_prices.yaml").read_text()))


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_manifests_validate_strictly(
    tmp_path: Path,
    version: str,
    pod: dict,
    job_and_service: list[dict],
    static_job: list[dict],
    queued_pod: dict,
    queued_job: list[dict],
) -> None:
    path = tmp_path / "manifests.yaml"
    path.write_text(yaml.safe_dump_all([pod, *job_and_service, *static_job, queued_pod, *queued_job]))
    cli = Path(sys.executable).with_name("kubernetes-validate")
    done = subprocess.run(
        [str(cli), "--strict", "-k", version, str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    passed = [line for line in done.stdout.splitlines() if "passed" in line]
    assert len(passed) == 8 and all(
        f"against version {version.rsplit('.', 1)[0]}" in line for line in passed
    ), done.stdout


def test_the_validator_rejects_a_broken_manifest(tmp_path: Path, pod: dict) -> None:
    # Guards the test above: --strict must refuse an unknown field and a wrong type.
    broken = json.loads(json.dumps(pod))
    broken["spec"]["containers"][0]["gpus"] = 4
    broken["spec"]["restartPolicy"] = ["Never"]
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    cli = Path(sys.executable).with_name("kubernetes-validate")
    done = subprocess.run(
        [str(cli), "--strict", "-k", "1.33.0", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode != 0 and "gpus" in done.stdout + done.stderr


def test_pod_resources_volumes_and_scheduling(pod: dict) -> None:
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert (
        container["name"] == "base"
        and container["image"] == "registry.example.com/ml/trainpipe-trainer:0.1.0"
    )
    assert container["resources"] == {
        "requests": {"cpu": "16", "memory": "64Gi"},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "4"},
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/dev/shm"] == "dshm"
    assert spec["nodeSelector"] == {
        "karpenter.sh/capacity-type": "spot",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    }
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["priorityClassName"] == "ml-batch"
    assert spec["serviceAccountName"] == "trainpipe-trainer"
    assert spec["imagePullSecrets"] == [{"name": "registry-example-com"}]
    assert spec["restartPolicy"] == "Never"
    assert container["command"][:3] == ["python", "-m", "torch.distributed.run"]
    assert "--standalone" in container["command"] and container["command"][-4:] == [
        "-m",
        "airflow_trainpipe.runtime.train",
        "--spec",
        "$(TRAINPIPE_SPEC)",
    ]
    assert container["command"][container["command"].index("--nproc-per-node") + 1] == "4"


def test_security_context_is_non_root_without_privilege_escalation(
    pod: dict, job_and_service: list[dict]
) -> None:
    for spec in (pod["spec"], job_and_service[0]["spec"]["template"]["spec"]):
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 1000
        assert spec["automountServiceAccountToken"] is False
        context = spec["containers"][0]["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["runAsNonRoot"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["readOnlyRootFilesystem"] is True


def test_labels_name_dag_task_run_and_try(pod: dict, job_and_service: list[dict]) -> None:
    from airflow.providers.cncf.kubernetes.pod_generator import make_safe_label_value

    expected = {
        "dag_id": "house_prices",
        "task_id": "train",
        "run_id": make_safe_label_value(RUN_ID),
        "try_number": "2",
    }
    job, service = job_and_service
    for labels in (
        pod["metadata"]["labels"],
        job["metadata"]["labels"],
        job["spec"]["template"]["metadata"]["labels"],
        service["metadata"]["labels"],
    ):
        assert {k: labels[k] for k in expected} == expected
    assert labels["run_id"] != RUN_ID  # sanitised, the way KubernetesPodOperator labels its pods


def test_a_queue_labels_the_pod_and_the_job_with_its_pods_and_suspends_the_job(
    queued_pod: dict, queued_job: list[dict]
) -> None:
    job, service = queued_job
    for labels in (
        queued_pod["metadata"]["labels"],
        job["metadata"]["labels"],
        job["spec"]["template"]["metadata"]["labels"],
    ):
        assert labels["kueue.x-k8s.io/queue-name"] == "ml-gpu" and labels["try_number"] == "2"
    # Kueue admits the Job by unsuspending it: until then the Job controller creates no pod.
    assert job["spec"]["suspend"] is True
    assert "suspend" not in queued_pod["spec"]  # a Pod is held by Kueue's scheduling gate instead
    assert QUEUE_LABEL not in service["metadata"]["labels"]  # not a workload: nothing to queue
    # Queueing changes nothing else of what the pods run (but the config inside the TrainSpec).
    assert _without_spec(queued_pod["spec"]) == _without_spec(_render(_single_node_config())[0]["spec"])


def _without_spec(pod_spec: dict) -> dict:
    (container,) = pod_spec["containers"]
    env = [e for e in container["env"] if e["name"] != "TRAINPIPE_SPEC"]
    return {**pod_spec, "containers": [{**container, "env": env}]}


def test_without_a_queue_nothing_is_queued(
    pod: dict, job_and_service: list[dict], static_job: list[dict]
) -> None:
    for manifest in (pod, *job_and_service, *static_job):
        assert QUEUE_LABEL not in manifest["metadata"]["labels"]
        assert "suspend" not in manifest["spec"]
    for job in (job_and_service[0], static_job[0]):
        assert QUEUE_LABEL not in job["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("text", ["house_prices", RUN_ID, "x" * 80, "-leading.and.trailing-", "a/b c", ""])
def test_label_value_matches_airflows_sanitiser(text: str) -> None:
    from airflow.providers.cncf.kubernetes.pod_generator import make_safe_label_value

    assert label_value(text) == make_safe_label_value(text)


def test_job_is_indexed_with_a_headless_service_for_the_rendezvous(static_job: list[dict]) -> None:
    job, service = static_job
    name = job["metadata"]["name"]
    assert (
        job["spec"]["completionMode"] == "Indexed"
        and job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    )
    template = job["spec"]["template"]["spec"]
    assert template["subdomain"] == service["metadata"]["name"] == name
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": name}
    command = template["containers"][0]["command"]
    assert command[command.index("--master-addr") + 1] == f"{name}-0.{name}"
    assert command[command.index("--node-rank") + 1] == "$(NODE_RANK)"
    env = {e["name"]: e for e in template["containers"][0]["env"]}
    assert (
        env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert "successPolicy" not in job["spec"]


def test_elastic_job_uses_c10d_rendezvous_and_finishes_with_index_0(job_and_service: list[dict]) -> None:
    job, _ = job_and_service
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--nnodes") + 1] == "1:2"
    assert command[command.index("--rdzv-backend") + 1] == "c10d"
    assert job["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}


def test_secrets_are_references_and_no_secret_value_appears(pod: dict, job_and_service: list[dict]) -> None:
    text = yaml.safe_dump_all([pod, *job_and_service])
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["MLFLOW_TRACKING_TOKEN"] == {
        "name": "MLFLOW_TRACKING_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "mlflow-auth", "key": "token"}},
    }
    for value in SECRET_VALUES:
        assert value not in text
    # Whatever the worker's environment holds never reaches a manifest either.
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AIRFLOW_CONN_AWS_DEFAULT"):
        assert name not in text


def test_worker_environment_secrets_do_not_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in zip(
        ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN"), SECRET_VALUES, strict=True
    ):
        monkeypatch.setenv(name, value)
    text = yaml.safe_dump_all(
        _render(_single_node_config()) + _render((EXAMPLE_CONFIGS / "house_prices.yaml").read_text())
    )
    for value in SECRET_VALUES:
        assert value not in text


def test_spec_travels_in_an_env_var_and_round_trips(pod: dict) -> None:
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    spec = TrainSpec.from_json(env["TRAINPIPE_SPEC"]["value"].replace("$$(", "$("))
    assert spec.run_id == RUN_ID and spec.config.pipeline == "house_prices"
    assert env["TRAINPIPE_TRY_NUMBER"]["value"] == "2"


def test_a_new_try_gets_new_names_the_same_try_the_same() -> None:
    first, again, second = (RunLabels("house_prices", "train", RUN_ID, n).workload_name() for n in (1, 1, 2))
    assert first == again != second
    long = RunLabels("p" * 250, "train", RUN_ID, 12).workload_name()
    assert len("job-" + long + "-0") <= 63  # the Job's pod hostnames are DNS labels


def test_cpu_job_sets_the_cpu_accelerator_and_no_gpu_limit() -> None:
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    text = text.replace(
        "  launcher: local\n",
        "  launcher: kubernetes\n  image: trainer:1\n  kubernetes: {volumes: [{claim: shared, mount_path: /shared}]}\n",
    )
    text = text.replace("uri: data/card_transactions", "uri: file:///shared/data").replace(
        "uri: checkpoints", "uri: file:///shared/checkpoints"
    )
    (pod_manifest,) = _render(text)
    container = pod_manifest["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert {"name": "DS_ACCELERATOR", "value": "cpu"} in container["env"]
    assert {"name": "data-0", "mountPath": "/shared", "readOnly": False} in container["volumeMounts"]
    command = container_command(parse_config(text))
    assert command[:5] == ["python", "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    assert "--standalone" in command
    # torchrun waits the preemption grace (30 s by default) and the ranks' exit before SIGKILL,
    # told through its environment: an older torchrun refuses an option it lacks.
    assert "--shutdown-timeout" not in command
    assert {"name": "PET_SHUTDOWN_TIMEOUT", "value": "35"} in container["env"]
    assert pod_manifest["spec"]["terminationGracePeriodSeconds"] == 40


def test_a_text_pipeline_renders_validates_and_downloads_nothing(tmp_path: Path) -> None:
    # The support_tickets text encoder on the house_prices example's cluster settings, one node.
    text = (EXAMPLE_CONFIGS / "support_tickets.yaml").read_text()
    training = _single_node_config().split("\ntraining:\n", 1)[1].split("\n\ngate:", 1)[0]
    cluster = training[training.index("  deepspeed:") :]
    text = text.replace("uri: data/support_tickets", "uri: s3://ml-data/support-tickets")
    text = text.replace(
        "  resources:\n    gpus_per_node: 0\n    processes_per_node: 2\n  checkpoint:\n    uri: checkpoints\n    every_steps: 100\n",
        cluster + "\n",
    )
    config = parse_config(text)
    assert config.training.launcher == "kubernetes" and config.data.features.text == ["subject", "body"]
    (pod,) = _render(text)
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    cli = Path(sys.executable).with_name("kubernetes-validate")
    done = subprocess.run(
        [str(cli), "--strict", "-k", "1.33.0", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert (
        env["HF_HUB_OFFLINE"] == "1"
    )  # the encoder is built from its config, the tokenizer fitted in the job
    spec = TrainSpec.from_json(env["TRAINPIPE_SPEC"].replace("$$", "$"))
    assert (
        spec.config.features.text["subject"].vocab_size == 800
        and spec.config.training.model == "text_encoder"
    )


def test_render_cli_prints_the_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(EXAMPLE_CONFIGS / "house_prices.yaml"), "--ds", "2026-01-05"]) == 0
    out = capsys.readouterr().out
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["Job", "Service"]
    env = {e["name"]: e for e in docs[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    spec = json.loads(env["TRAINPIPE_SPEC"]["value"])
    assert spec["data_files"] == [
        "s3://ml-data/house-sales/week=2026-01-05/part-00000.csv"
    ]  # partition template rendered
    assert spec["run_id"] == "scheduled__2026-01-05T00:00:00+00:00"
    assert docs[0]["metadata"]["labels"]["try_number"] == "1"


def test_render_cli_prints_the_queue_label_and_the_suspended_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "house_prices.yaml"
    path.write_text(_queued((EXAMPLE_CONFIGS / "house_prices.yaml").read_text(), "team-a"))
    assert main(["render", str(path), "--ds", "2026-01-05"]) == 0
    job, service = yaml.safe_load_all(capsys.readouterr().out)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["template"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["suspend"] is True and service["kind"] == "Service"

    path.write_text(_queued(_single_node_config(), "team-a"))
    assert main(["render", str(path), "--ds", "2026-01-05"]) == 0
    (pod,) = yaml.safe_load_all(capsys.readouterr().out)
    assert pod["kind"] == "Pod" and pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def test_render_cli_refuses_a_local_launcher_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(EXAMPLE_CONFIGS / "fraud_detector.yaml")]) == 1
    assert "launcher is 'local'" in capsys.readouterr().err


def test_example_config_loads() -> None:
    assert load_config(EXAMPLE_CONFIGS / "house_prices.yaml").training.kubernetes.min_nodes == 1


def _with_aws_connection() -> str:
    return _single_node_config().replace(
        "    shm_size: 16Gi\n", "    shm_size: 16Gi\n    aws_conn_id: trainpipe_aws\n"
    )


def test_an_airflow_connection_becomes_a_per_try_secret_reference() -> None:
    from airflow_trainpipe.launchers.kubernetes_manifests import (
        connection_secret,
        connection_secret_name,
    )

    (pod_manifest,) = _render(_with_aws_connection())
    labels = RunLabels("house_prices", "train", RUN_ID, 2)
    assert pod_manifest["spec"]["containers"][0]["envFrom"] == [
        {"secretRef": {"name": connection_secret_name(labels)}}
    ]
    config = parse_config(_with_aws_connection())
    secret = connection_secret(config, labels, "ml-training", {"AWS_SECRET_ACCESS_KEY": SECRET_VALUES[1]})
    assert (
        secret["metadata"]["name"] == connection_secret_name(labels)
        and secret["metadata"]["labels"]["try_number"] == "2"
    )
    assert SECRET_VALUES[1] not in yaml.safe_dump(pod_manifest)


def test_aws_environment_comes_from_the_airflow_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_trainpipe.launchers.kubernetes_cluster import aws_environment

    monkeypatch.setenv(
        "AIRFLOW_CONN_TRAINPIPE_AWS",
        json.dumps(
            {
                "conn_type": "aws",
                "login": SECRET_VALUES[0],
                "password": SECRET_VALUES[1],
                "extra": {"region_name": "eu-west-1", "endpoint_url": "http://minio:9000"},
            }
        ),
    )
    assert aws_environment("trainpipe_aws") == {
        "AWS_ACCESS_KEY_ID": SECRET_VALUES[0],
        "AWS_SECRET_ACCESS_KEY": SECRET_VALUES[1],
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://minio:9000",
    }


def test_event_watcher_keeps_what_the_task_needs_and_logs_progress_lines() -> None:
    from airflow_trainpipe.contracts.events import PREFIX
    from airflow_trainpipe.launchers.watcher import JobWatcher

    class Store(dict):  # the part of Airflow's task_state_store the watcher uses
        def set(self, key: str, value: object) -> None:
            self[key] = value

    store = Store()
    watcher = JobWatcher(store)
    lines = [
        PREFIX
        + json.dumps(
            {
                "event": "start",
                "total_steps": 20,
                "resumed_from": 10,
                "steps_recomputed": 3,
                "world_size": 8,
                "global_batch": 4096,
                "train_rows": 9000,
                "holdout_rows": 1000,
                "mlflow_run_id": "abc",
            }
        ),
        "[rank0] INFO some plain log line",
        PREFIX
        + json.dumps(
            {"event": "checkpoint", "step": 20, "uri": "s3://ml-checkpoints/x/step_000000020", "metric": None}
        ),
        PREFIX + json.dumps({"event": "error", "rank": 3, "error": "RuntimeError: NCCL timeout"}),
    ]
    shown = [watcher.log_formatter("base", line) for line in lines]
    assert (
        shown[0].startswith("training started: 20 steps on 8 rank(s)") and "resuming from step 10" in shown[0]
    )
    assert shown[1] == lines[1] and list(watcher.tail) == [lines[1]]
    assert shown[2] == "checkpoint complete: step 20 at s3://ml-checkpoints/x/step_000000020"
    assert store == {
        "mlflow_run_id": "abc",
        "checkpoint": {"step": 20, "uri": "s3://ml-checkpoints/x/step_000000020"},
    }
    assert watcher.errors == ["rank 3: RuntimeError: NCCL timeout"] and watcher.result is None
    assert not watcher.final  # an NCCL timeout may pass: retried
    watcher.log_formatter(
        "base",
        PREFIX
        + json.dumps(
            {"event": "error", "rank": 0, "error": "ChangedDataError: x changed", "retryable": False}
        ),
    )
    assert watcher.final  # bad data does not fix itself: the task fails without retries
