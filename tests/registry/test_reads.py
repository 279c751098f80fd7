"""Registry reads: "no champion" only from the registry's own answer, never from a failed request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_trainpipe.config import load_config
from airflow_trainpipe.registry.reads import (
    RegistryError,
    RegistryUnavailable,
    champion_data_digest,
    current_champion,
    finished_run,
    get_run,
)
from tests.conftest import EXAMPLE_CONFIGS, free_port, fresh_mlflow_store


@pytest.fixture
def sqlite_client(tmp_path: Path, migrated_mlflow_db: Path):
    from mlflow import MlflowClient

    uri = fresh_mlflow_store(tmp_path, migrated_mlflow_db)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


@pytest.fixture
def unreachable(monkeypatch: pytest.MonkeyPatch) -> str:
    """A tracking URI where nothing listens (a port just freed), answered at once: no retries."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    return f"http://127.0.0.1:{free_port()}"


def test_no_model_and_no_alias_mean_no_champion(sqlite_client) -> None:
    assert current_champion(sqlite_client, "fraud", "champion") is None
    sqlite_client.create_registered_model("fraud")
    assert current_champion(sqlite_client, "fraud", "champion") is None
    assert champion_data_digest(sqlite_client, "fraud", "champion") is None


def test_the_champion_and_its_data_digest(sqlite_client) -> None:
    experiment = sqlite_client.create_experiment("e")
    run = sqlite_client.create_run(experiment, tags={"trainpipe.data_digest": "sha256:abc"})
    sqlite_client.create_registered_model("fraud")
    version = sqlite_client.create_model_version("fraud", source="file:///nowhere", run_id=run.info.run_id)
    sqlite_client.set_registered_model_alias("fraud", "champion", version.version)
    assert current_champion(sqlite_client, "fraud", "champion") == (str(version.version), run.info.run_id)
    assert champion_data_digest(sqlite_client, "fraud", "champion") == "sha256:abc"


def test_an_unreachable_registry_is_never_no_champion(unreachable: str) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=unreachable, registry_uri=unreachable)
    with pytest.raises(RegistryUnavailable, match="cannot read fraud@champion from the MLflow registry"):
        current_champion(client, "fraud", "champion")
    with pytest.raises(RegistryUnavailable):
        champion_data_digest(client, "fraud", "champion")
    with pytest.raises(RegistryUnavailable, match="cannot read MLflow run 'abc'"):
        get_run(client, "abc")


def test_a_missing_run_is_final(sqlite_client) -> None:
    with pytest.raises(RegistryError, match="MLflow run 'abc' not found") as caught:
        get_run(sqlite_client, "abc")
    assert not isinstance(caught.value, RegistryUnavailable)


def _unreachable_connection(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    monkeypatch.setenv(
        "AIRFLOW_CONN_MLFLOW_DEFAULT",
        json.dumps({"conn_type": "mlflow", "host": f"http://{host}", "port": int(port)}),
    )


def test_validate_with_champion_reference_retries_when_the_registry_is_unreachable(
    unreachable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It used to read "no champion yet" and compare drift with the previous snapshot instead.
    from airflow_trainpipe.operators.validate import DataValidateOperator

    _unreachable_connection(monkeypatch, unreachable)
    config = load_config(EXAMPLE_CONFIGS / "fraud_detector.yaml")
    config = config.model_copy(
        update={
            "validation": config.validation.model_copy(
                update={"drift": config.validation.drift.model_copy(update={"reference": "champion"})}
            )
        }
    )
    operator = DataValidateOperator(task_id="validate_data", config=config)
    with pytest.raises(
        AirflowException, match="drift reference 'champion': cannot read fraud_detector@champion"
    ) as caught:
        operator._reference({"partition": "ds=2026-01-01", "digest": "sha256:x", "rows": 1})
    assert not isinstance(caught.value, AirflowFailException)  # retryable


def test_gate_and_register_retry_an_unreachable_registry_and_fail_a_missing_run(
    unreachable: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.sdk.definitions.retry_policy import RetryAction

    from airflow_trainpipe.core.retry_policy import TRAINPIPE_RETRY_POLICY
    from airflow_trainpipe.hooks.mlflow import MlflowHook

    _unreachable_connection(monkeypatch, unreachable)
    with pytest.raises(RegistryUnavailable, match="cannot read MLflow run 'abc'") as retried:
        MlflowHook().call(finished_run, "abc")
    assert retried.value.retryable is True
    assert TRAINPIPE_RETRY_POLICY.evaluate(retried.value, 1, 3).action is RetryAction.RETRY
    monkeypatch.setenv(
        "AIRFLOW_CONN_MLFLOW_DEFAULT",
        json.dumps({"conn_type": "mlflow", "extra": {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}),
    )
    with pytest.raises(RegistryError, match="candidate MLflow run 'abc' not found") as final:
        MlflowHook().call(finished_run, "abc")
    assert type(final.value) is RegistryError and final.value.retryable is False
    assert TRAINPIPE_RETRY_POLICY.evaluate(final.value, 1, 3).action is RetryAction.FAIL
