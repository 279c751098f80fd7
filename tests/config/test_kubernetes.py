"""config.kubernetes: pod settings of `launcher: kubernetes`: names, Secrets by reference, env, volumes."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from airflow_trainpipe.config import load_config
from airflow_trainpipe.config.kubernetes import (
    RESERVED_ENV,
    EnvKey,
    KubernetesSection,
    Toleration,
    VolumeMount,
)
from airflow_trainpipe.core.exceptions import ConfigError
from tests.conftest import EXAMPLE_CONFIGS

SECRET_NAME_PROBLEM = "expected the name of a Kubernetes Secret (lower-case DNS name), got "


def _error(**data: Any) -> tuple[tuple[Any, ...], str]:
    """The one error `data` gives a KubernetesSection: its location and message."""
    with pytest.raises(ValidationError) as caught:
        KubernetesSection.model_validate(data)
    [error] = caught.value.errors(include_url=False)
    return tuple(error["loc"]), error["msg"].removeprefix("Value error, ")


def test_defaults_run_non_root_pods_that_airflow_retries() -> None:
    section = KubernetesSection()
    assert (section.namespace, section.kubernetes_conn_id) == (None, "kubernetes_default")
    assert (section.run_as_user, section.shm_size, section.image_pull_policy) == (1000, "2Gi", "IfNotPresent")
    assert (section.backoff_limit, section.min_nodes) == (0, None)
    assert section.startup_timeout == timedelta(minutes=10)


@pytest.mark.parametrize("namespace", ["ml", "team-a", "a" * 63])
def test_a_namespace_is_a_dns_label(namespace: str) -> None:
    assert KubernetesSection(namespace=namespace).namespace == namespace


@pytest.mark.parametrize("namespace", ["ML", "team.a", "-ml", "ml-", "a" * 64])
def test_a_namespace_that_is_not_a_dns_label_is_rejected(namespace: str) -> None:
    loc, _message = _error(namespace=namespace)
    assert loc == ("namespace",)


@pytest.mark.parametrize("field", ["service_account", "priority_class"])
def test_object_names_may_be_dotted_dns_subdomains(field: str) -> None:
    assert (
        getattr(KubernetesSection.model_validate({field: "batch.low-priority"}), field)
        == "batch.low-priority"
    )
    assert _error(**{field: "Batch"})[0] == (field,)


@pytest.mark.parametrize("field", ["env_from", "registry_auth"])
@pytest.mark.parametrize("name", ["AWS", "a_b", "", "a" * 254])
def test_secret_references_must_be_secret_names(field: str, name: str) -> None:
    assert _error(**{field: ["ok-secret", name]}) == ((field,), SECRET_NAME_PROBLEM + repr(name))


def test_secret_references_up_to_253_characters_are_accepted() -> None:
    name = ".".join(["a" * 63] * 4)[:253]
    assert KubernetesSection(env_from=[name], registry_auth=["regcred"]).env_from == [name]


@pytest.mark.parametrize("name", ["9LIVES", "MY-VAR", "A B"])
def test_env_names_must_be_environment_variable_names(name: str) -> None:
    assert _error(env={name: "1"}) == (("env",), f"{name!r} is not an environment variable name")


@pytest.mark.parametrize("name", RESERVED_ENV)
def test_variables_the_launcher_sets_cannot_be_overridden(name: str) -> None:
    assert _error(env={name: "x"}) == (("env",), f"{name} is set by the launcher and cannot be overridden")


def test_reserved_names_are_case_sensitive() -> None:
    assert KubernetesSection(env={"home": "/x", "_PRIVATE": "1"}).env == {"home": "/x", "_PRIVATE": "1"}


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("http://user:hunter2@mlflow:5000", "a password in a URI (user:password@host)"),
        ("AKIAABCDEFGHIJKLMNOP", "an AWS access key id"),
        ("https://s3.example/x?X-Amz-Signature=abc", "a secret in a URI's query string"),
    ],
)
def test_an_env_value_carrying_a_credential_is_located_at_its_name(value: str, kind: str) -> None:
    with pytest.raises(ValidationError) as caught:
        KubernetesSection(env={"SAFE": "http://mlflow:5000", "LEAK": value})
    [error] = caught.value.errors()
    assert error["loc"] == ("env",)
    [(loc, message)] = error["ctx"]["problems"]
    assert loc == ("LEAK",)
    assert message.startswith(f"the value carries {kind}; put credentials in a Kubernetes Secret")


def test_plain_settings_in_env_are_fine() -> None:
    env = {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "AWS_ENDPOINT_URL": "http://minio:9000"}
    assert KubernetesSection(env=env).env == env


def test_an_env_key_names_its_secret_with_from() -> None:
    key = EnvKey.model_validate(
        {"name": "AWS_ACCESS_KEY_ID", "from": "trainpipe-aws", "key": "access-key-id"}
    )
    assert (key.name, key.source, key.key) == ("AWS_ACCESS_KEY_ID", "trainpipe-aws", "access-key-id")
    with pytest.raises(ValidationError) as caught:
        EnvKey.model_validate({"name": "X", "source": "s", "key": "k"})
    assert {e["type"] for e in caught.value.errors()} == {"missing", "extra_forbidden"}


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "1X"), ("from", "Trainpipe"), ("key", "a/b"), ("key", "")],
)
def test_env_key_parts_follow_kubernetes_rules(field: str, value: str) -> None:
    data = {"name": "X", "from": "s", "key": "k", field: value}
    with pytest.raises(ValidationError) as caught:
        EnvKey.model_validate(data)
    assert [e["loc"] for e in caught.value.errors()] == [(field,)]


@pytest.mark.parametrize("path", ["data", "/data:ro", ""])
def test_a_volume_mounts_at_an_absolute_path_without_colons(path: str) -> None:
    with pytest.raises(ValidationError) as caught:
        VolumeMount(claim="shared", mount_path=path)
    assert [e["loc"] for e in caught.value.errors()] == [("mount_path",)]
    assert VolumeMount(claim="shared", mount_path="/mnt/data").read_only is False


@pytest.mark.parametrize(("value", "stored"), [(4, "4"), (0.5, "0.5"), ("512Mi", "512Mi"), ("100m", "100m")])
def test_shm_size_is_a_kubernetes_quantity(value: Any, stored: str) -> None:
    assert KubernetesSection(shm_size=value).shm_size == stored


@pytest.mark.parametrize("value", ["4GB", "-1Gi", "", True])
def test_shm_size_that_is_no_quantity_is_rejected(value: Any) -> None:
    assert _error(shm_size=value)[0] == ("shm_size",)


def test_a_toleration_defaults_to_equal_with_every_effect() -> None:
    toleration = Toleration(key="spot", value="true")
    assert (toleration.operator, toleration.effect, toleration.toleration_seconds) == ("Equal", None, None)


def test_a_toleration_operator_is_case_sensitive() -> None:
    with pytest.raises(ValidationError, match="Input should be 'Equal' or 'Exists'"):
        Toleration.model_validate({"operator": "exists"})


@pytest.mark.parametrize(("field", "value"), [("run_as_user", 0), ("min_nodes", 0), ("backoff_limit", -1)])
def test_counts_have_lower_bounds(field: str, value: int) -> None:
    assert _error(**{field: value})[0] == (field,)


def test_the_startup_timeout_must_be_positive() -> None:
    assert _error(startup_timeout="0s") == (
        ("startup_timeout",),
        "expected a duration greater than zero, got 0s",
    )


def test_no_queue_by_default() -> None:
    assert KubernetesSection().queue is None


@pytest.mark.parametrize("queue", ["ml-gpu", "team-a.batch-1", "q", "a" * 63])
def test_a_queue_is_a_localqueue_name(queue: str) -> None:
    assert KubernetesSection(queue=queue).queue == queue


@pytest.mark.parametrize(
    "queue", ["", "-ml", "ml-", "_ml", "ml.", "a" * 64, "ml/gpu", "ml gpu", "ml-gpu\n", "Team-A", "team_a"]
)
def test_a_queue_that_no_localqueue_can_be_named_is_rejected(queue: str) -> None:
    # Upper case and '_' fit a label value but no object name: such a try would wait for ever.
    assert _error(queue=queue) == (
        ("queue",),
        "expected the name of a Kueue LocalQueue (at most 63 characters: lowercase letters, "
        f"digits, '-' and '.', starting and ending with a letter or digit), got {queue!r}",
    )


def test_a_bad_queue_is_located_at_training_kubernetes_queue(tmp_path: Path) -> None:
    text = (EXAMPLE_CONFIGS / "house_prices.yaml").read_text()
    assert "    shm_size: 16Gi\n" in text
    path = tmp_path / "house_prices.yaml"
    path.write_text(text.replace("    shm_size: 16Gi\n", "    shm_size: 16Gi\n    queue: ml/gpu\n"))
    line = path.read_text().splitlines().index("    queue: ml/gpu") + 1
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [problem] = caught.value.problems
    assert (problem.file, problem.line, problem.path) == (str(path), line, "training.kubernetes.queue")
    assert str(problem).startswith(f"{path}:{line}:") and problem.message.endswith("got 'ml/gpu'")
