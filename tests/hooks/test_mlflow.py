"""MlflowHook: connection -> tracking URI, UI URL and credential environment; real server round trips."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airflow_trainpipe.hooks.mlflow import MlflowHook
from airflow_trainpipe.registry.reads import RegistryError


@pytest.fixture
def connection(monkeypatch: pytest.MonkeyPatch):
    """Define an Airflow connection the standard way: an AIRFLOW_CONN_<ID> environment variable."""

    def define(conn_id: str, **fields: object) -> None:
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "mlflow", **fields}))

    return define


def test_provider_metadata() -> None:
    assert (MlflowHook.conn_type, MlflowHook.default_conn_name, MlflowHook.conn_name_attr) == (
        "mlflow",
        "mlflow_default",
        "mlflow_conn_id",
    )
    behaviour = MlflowHook.get_ui_field_behaviour()
    assert "host" in behaviour["relabeling"] and "ui_url" in behaviour["placeholders"]["extra"]


def test_no_connection_is_the_embedded_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_MLFLOW_DEFAULT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path))
    hook = MlflowHook()
    assert hook.tracking_uri == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert hook.environment() == {"MLFLOW_TRACKING_URI": hook.tracking_uri}
    assert hook.ui_url is None and hook.run_url("1", "abc") is None


def test_an_explicitly_named_connection_must_exist() -> None:
    from airflow.sdk.exceptions import AirflowNotFoundException

    with pytest.raises(AirflowNotFoundException, match="mlflow_prod"):
        _ = MlflowHook("mlflow_prod").tracking_uri


def test_http_connection_with_basic_auth(connection) -> None:
    connection(
        "mlflow_default",
        host="https://mlflow.example.com",
        port=8443,
        schema="tracking",
        login="svc",
        password="pa55-word-x",
    )
    hook = MlflowHook()
    assert hook.tracking_uri == "https://mlflow.example.com:8443/tracking"
    assert hook.ui_url == "https://mlflow.example.com:8443/tracking"
    assert hook.environment() == {
        "MLFLOW_TRACKING_URI": "https://mlflow.example.com:8443/tracking",
        "MLFLOW_TRACKING_USERNAME": "svc",
        "MLFLOW_TRACKING_PASSWORD": "pa55-word-x",
    }
    assert "pa55-word-x" not in repr(hook.target)
    assert hook.run_url("3", "r1") == "https://mlflow.example.com:8443/tracking/#/experiments/3/runs/r1"
    assert (
        hook.model_version_url("fraud detector", 2)
        == "https://mlflow.example.com:8443/tracking/#/models/fraud%20detector/versions/2"
    )


def test_host_without_scheme_is_http_and_a_lone_password_is_a_token(connection) -> None:
    connection("mlflow_tok", host="mlflow.internal", port=5000, password="tok-123456")
    hook = MlflowHook("mlflow_tok")
    assert hook.environment() == {
        "MLFLOW_TRACKING_URI": "http://mlflow.internal:5000",
        "MLFLOW_TRACKING_TOKEN": "tok-123456",
    }


def test_tracking_uri_extra_wins_and_ui_url_extra_is_used(connection) -> None:
    connection(
        "mlflow_x",
        host="ignored",
        extra={
            "tracking_uri": "sqlite:////data/mlflow.db",
            "ui_url": "http://ui:5000/",
            "token": "tok-abcdef",
        },
    )
    hook = MlflowHook("mlflow_x")
    assert hook.tracking_uri == "sqlite:////data/mlflow.db"
    assert hook.ui_url == "http://ui:5000"
    assert hook.environment()["MLFLOW_TRACKING_TOKEN"] == "tok-abcdef"


def test_connection_without_host_or_uri_is_an_error(connection) -> None:
    connection("mlflow_empty")
    with pytest.raises(RegistryError, match="'mlflow_empty' has neither a host nor an extra 'tracking_uri'"):
        _ = MlflowHook("mlflow_empty").tracking_uri


def test_secrets_are_registered_with_the_masker(connection) -> None:
    from airflow.sdk._shared.secrets_masker import redact

    connection(
        "mlflow_m",
        host="http://h",
        login="u",
        password="very-secret-pw",
        extra={"token": "very-secret-token"},
    )
    MlflowHook("mlflow_m").environment()
    assert "very-secret-pw" not in str(redact("password is very-secret-pw"))
    assert "very-secret-token" not in str(redact("token very-secret-token"))


def test_activated_sets_the_environment_for_the_block_only(
    connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////before.db")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "stale-token")
    connection("mlflow_b", host="http://h:1", login="u", password="p-123456")
    with MlflowHook("mlflow_b").activated():
        import mlflow

        assert mlflow.get_tracking_uri() == "http://h:1"
        assert os.environ["MLFLOW_TRACKING_USERNAME"] == "u" and "MLFLOW_TRACKING_TOKEN" not in os.environ
    assert os.environ["MLFLOW_TRACKING_URI"] == "sqlite:////before.db"
    assert (
        os.environ["MLFLOW_TRACKING_TOKEN"] == "stale-token" and "MLFLOW_TRACKING_USERNAME" not in os.environ
    )


def test_call_runs_a_client_function_with_the_connection_active(
    connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # How the tasks run registry/reads.py: the function gets this connection's client, and the
    # credentials are in the environment only while it runs.
    monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    connection("mlflow_c", host="http://h:2", extra={"token": "tok-123456"})

    def read(client, model: str, *, alias: str) -> tuple[str, str, str]:
        return client.tracking_uri, os.environ["MLFLOW_TRACKING_TOKEN"], f"{model}@{alias}"

    assert MlflowHook("mlflow_c").call(read, "fraud", alias="champion") == (
        "http://h:2",
        "tok-123456",
        "fraud@champion",
    )
    assert "MLFLOW_TRACKING_TOKEN" not in os.environ


def test_real_server_needs_the_connections_credentials(mlflow_server, connection) -> None:
    host, port = mlflow_server.url.rsplit(":", 1)
    connection(
        "mlflow_ok", host=host, port=int(port), login=mlflow_server.username, password=mlflow_server.password
    )
    connection("mlflow_anonymous", host=host, port=int(port))
    ok, message = MlflowHook("mlflow_ok").test_connection()
    assert ok, message
    denied, message = MlflowHook("mlflow_anonymous").test_connection()
    assert not denied
    assert "401" in message, message


def test_credentials_written_into_the_uri_never_reach_links_or_messages(connection) -> None:
    connection("mlflow_default", extra={"tracking_uri": "https://svc:uri-pa55-x@mlflow.example.com/api"})
    hook = MlflowHook()
    assert hook.tracking_uri == "https://svc:uri-pa55-x@mlflow.example.com/api"  # the client needs it
    assert hook.ui_url == "https://***@mlflow.example.com/api"
    assert "uri-pa55-x" not in hook.run_url("1", "abc") and "uri-pa55-x" not in hook.model_version_url("m", 1)
    assert "uri-pa55-x" not in repr(hook.target)


@pytest.mark.parametrize(("deployment", "inside"), [(None, False), ("true", True)])
def test_mlflows_progress_bars_are_off_while_a_connection_is_active_unless_the_deployment_set_them(
    connection, monkeypatch: pytest.MonkeyPatch, deployment: str | None, inside: bool
) -> None:
    # A task log is a file: each refresh of a bar was a line ("Downloading artifacts:   0%|...").
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR

    if deployment is None:
        monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", deployment)
    connection("mlflow_p", host="http://h:3")
    with MlflowHook("mlflow_p").activated():
        assert MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.get() is inside
    assert os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR") == deployment
