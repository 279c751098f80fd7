"""The rendered pod's container command, run here as a kubelet would run it: the same command
and args, the same environment (`$(VAR)` expanded by Kubernetes' rules, Secret references
resolved from a stand-in Secret store), the emptyDir at its mount path mapped to a temporary
directory, and file:// storage on the "mounted" volumes. Try 1 is killed with SIGKILL mid-run;
try 2's freshly rendered pod resumes from the run's checkpoint."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.contracts.events import parse
from airflow_trainpipe.contracts.train_spec import TrainSpec, run_dir_name
from airflow_trainpipe.launchers.kubernetes_manifests import SCRATCH, RunLabels, manifests
from tests.helpers.jobs import EVERY_STEPS, job_config_text

pytestmark = pytest.mark.slow

RUN_ID = "scheduled__2026-01-01T00:00:00+00:00"
# Stand-in for the cluster's Secret store: the kubelet resolves secretKeyRef from it.
CLUSTER_SECRETS = {("trainpipe-mlflow", "token"): "mlflow-token-from-the-secret"}
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' dependent-variable expansion: `$(VAR)` of a defined VAR, `$$` -> `$`."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(substitute, text)


def container_env(container: dict[str, Any], scratch: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in container["env"]:
        if "value" in entry:
            env[entry["name"]] = expand(entry["value"], env)
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = CLUSTER_SECRETS[(ref["name"], ref["key"])]
    # The emptyDir mounted at SCRATCH in the pod is a temporary directory here.
    return {name: value.replace(SCRATCH, str(scratch)) for name, value in env.items()}


def kubernetes_config(checkpoints: Path, data_root: Path, mlflow_db: Path) -> str:
    text = job_config_text(checkpoints)
    volumes = (
        f"[{{claim: data, mount_path: {data_root}, read_only: true}}, "
        f"{{claim: checkpoints, mount_path: {checkpoints}}}]"
    )
    text = text.replace(
        "  launcher: local\n",
        (
            "  launcher: kubernetes\n  image: trainpipe-trainer:test\n  kubernetes:\n"
            f"    volumes: {volumes}\n"
            f"    env: {{MLFLOW_TRACKING_URI: 'sqlite:///{mlflow_db}'}}\n"
            "    env_keys: [{name: MLFLOW_TRACKING_TOKEN, from: trainpipe-mlflow, key: token}]\n"
        ),
    )
    return text.replace("uri: data/card_transactions", f"uri: {data_root.as_uri()}")


def run_container(
    pod: dict[str, Any], scratch: Path, *, pause_at: str | None = None
) -> tuple[int, list[dict], str]:
    (container,) = pod["spec"]["containers"]
    env = container_env(container, scratch)
    command = [expand(arg, env) for arg in container["command"]]
    # The image's `python` is this virtualenv's.
    process_env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env}
    # On CPU, DeepSpeed JIT-compiles its shared-memory comm op on first use (~40 s; the CUDA
    # image never builds it), by default into $HOME/.cache, a fresh emptyDir in each pod: reuse
    # the op the session's other jobs built (conftest.py sets TORCH_EXTENSIONS_DIR).
    process_env["TORCH_EXTENSIONS_DIR"] = os.environ["TORCH_EXTENSIONS_DIR"]
    if pause_at:
        process_env["TRAINPIPE_PAUSE_AT"] = pause_at  # fault injection, not part of the manifest
    process = subprocess.Popen(
        command,
        env=process_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=scratch,
    )
    events, output = [], []
    assert process.stdout is not None
    for line in process.stdout:
        output.append(line)
        if (event := parse(line)) is not None:
            events.append(event)
        if pause_at and f"TRAINPIPE PAUSED {pause_at}" in line:
            _kill_tree(process)  # the node is lost: every process of the pod dies at once
    return process.wait(), events, "".join(output)


def _kill_tree(process: subprocess.Popen[str]) -> None:
    groups = {process.pid}
    for child in psutil.Process(process.pid).children(recursive=True):
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(child.pid))
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def test_rendered_pod_starts_the_entrypoint_and_a_second_try_resumes(
    tmp_path: Path, job_files: list[str]
) -> None:
    data_root = Path(job_files[0].removeprefix("file://")).parents[1]
    checkpoints = tmp_path / "checkpoints"
    config = parse_config(kubernetes_config(checkpoints, data_root, tmp_path / "mlflow.db"))
    spec = TrainSpec(config=config, run_id=RUN_ID, data_files=job_files).limited_to(2 * EVERY_STEPS)

    def pod_of_try(try_number: int) -> dict[str, Any]:
        (pod,) = manifests(spec, RunLabels(config.pipeline, "train", RUN_ID, try_number))
        assert pod["kind"] == "Pod"
        return pod

    first_pod = pod_of_try(1)
    command = first_pod["spec"]["containers"][0]["command"]
    assert command[command.index("--nproc-per-node") + 1] == "2"
    (tmp_path / "scratch-1").mkdir()
    code, events, output = run_container(first_pod, tmp_path / "scratch-1", pause_at="step:13")
    assert code != 0, output[-3000:]
    start = next(e for e in events if e["event"] == "start")
    assert start["world_size"] == 2 and start["resumed_from"] == 0
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [EVERY_STEPS], output[-3000:]
    assert not any(e["event"] == "result" for e in events)

    second_pod = pod_of_try(2)
    assert second_pod["metadata"]["name"] != first_pod["metadata"]["name"]
    (tmp_path / "scratch-2").mkdir()  # a new pod: a new, empty emptyDir
    code, events, output = run_container(second_pod, tmp_path / "scratch-2")
    assert code == 0, output[-3000:]
    resumed = next(e for e in events if e["event"] == "start")
    result = next(e for e in events if e["event"] == "result")
    assert resumed["resumed_from"] == EVERY_STEPS and result["resumed_from_step"] == EVERY_STEPS
    assert resumed["mlflow_run_id"] == start["mlflow_run_id"]  # the same MLflow run continues
    assert result["final_step"] == resumed["total_steps"] == 2 * EVERY_STEPS and result["world_size"] == 2
    assert min(e["step"] for e in events if e["event"] == "step") == EVERY_STEPS + 1
    assert (
        checkpoints / config.pipeline / run_dir_name("scheduled__2026-01-01T00:00:00+00:00") / "result.json"
    ).exists()
    # The Secret is named in the manifest, its value is not.
    assert CLUSTER_SECRETS[("trainpipe-mlflow", "token")] not in str(second_pod)
