"""Reads of the MLflow model registry that must tell "not there" from "cannot ask".

"No champion yet" changes what a run does (bootstrap rules, the drift reference), so it may only
be concluded from the registry's own answer that the model does not exist or no version holds
the alias. Anything else (the server unreachable, a 5xx, a locked database) is
`RegistryUnavailable`: the task fails and Airflow retries it, instead of bootstrapping a second
champion or comparing drift with the wrong snapshot.

mlflow is imported inside the functions: this module is used by Airflow tasks and by the
training job, never at parse time.
"""

from __future__ import annotations

from typing import Any

from airflow_trainpipe.core.exceptions import TrainpipeError

NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"


class RegistryError(TrainpipeError):
    """The model registry or tracking server answered with an error, or not at all."""


class RegistryUnavailable(RegistryError):
    """The registry could not be asked; retrying later can succeed."""

    retryable = True


def is_not_found(exc: BaseException) -> bool:
    """True only for MLflow's own "does not exist" answer."""
    return getattr(exc, "error_code", None) == NOT_FOUND


def current_champion(client: Any, model_name: str, alias: str) -> tuple[str, str] | None:
    """(version, run id) of the version holding `alias`; None only when the registry says there
    is no such model or no version holds the alias. RegistryUnavailable otherwise."""
    from mlflow.exceptions import MlflowException

    try:
        registered = client.get_registered_model(model_name)
        version = registered.aliases.get(alias)
        if version is None:
            return None
        return str(version), client.get_model_version(model_name, str(version)).run_id
    except MlflowException as exc:
        if is_not_found(exc):
            return None
        raise RegistryUnavailable(
            f"cannot read {model_name}@{alias} from the MLflow registry: {exc.message}"
        ) from exc


def champion_data_digest(client: Any, model_name: str, alias: str) -> str | None:
    """The data digest the champion was trained on (its lineage tag), None without a champion."""
    from mlflow.exceptions import MlflowException

    found = current_champion(client, model_name, alias)
    if found is None:
        return None
    version, run_id = found
    try:
        tags = client.get_model_version(model_name, version).tags
        return tags.get("trainpipe.data_digest") or client.get_run(run_id).data.tags.get(
            "trainpipe.data_digest"
        )
    except MlflowException as exc:
        raise RegistryUnavailable(
            f"cannot read the lineage of {model_name} version {version}: {exc.message}"
        ) from exc


def get_run(client: Any, run_id: str) -> Any:
    """The MLflow run; RegistryError (final) when it does not exist, RegistryUnavailable otherwise."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if is_not_found(exc):
            raise RegistryError(f"MLflow run {run_id!r} not found: {exc.message}") from exc
        raise RegistryUnavailable(f"cannot read MLflow run {run_id!r}: {exc.message}") from exc
