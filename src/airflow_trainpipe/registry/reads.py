"""Reads of the MLflow registry and tracking server that must tell "not there" from "cannot ask".

"No champion yet" changes what a run does (bootstrap rules, the drift reference), so it may only
be concluded from the registry's own answer that the model does not exist or no version holds
the alias. Anything else (the server unreachable, a 5xx, a locked database) is
`RegistryUnavailable`: the task fails and Airflow retries it, instead of bootstrapping a second
champion or comparing drift with the wrong snapshot. `RegistryError` alone is final.

Every function takes an `MlflowClient` and nothing of Airflow: the training job calls them with
its own client (runtime/evaluation/final.py), the tasks through `MlflowHook.call(fn, ...)`, which
opens the connection around the call. So this module sits on a floor below both (docs/
architecture.md); mlflow is imported inside the functions, never at parse time.
"""

from __future__ import annotations

import json
import tempfile
from typing import TYPE_CHECKING, Any, cast

from airflow_trainpipe.contracts.tags import (
    CHAMPION_ERROR_TAG,
    CHAMPION_RUN_ID_TAG,
    CHAMPION_VERSION_TAG,
    DATA_DIGEST_TAG,
    NO_CHAMPION,
    THRESHOLD_TAG,
)
from airflow_trainpipe.core.exceptions import RegistryError, RegistryUnavailable

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from airflow_trainpipe.contracts.payloads import Evaluation

NOT_FOUND = "RESOURCE_DOES_NOT_EXIST"


def is_not_found(exc: BaseException) -> bool:
    """True only for MLflow's own "does not exist" answer."""
    return getattr(exc, "error_code", None) == NOT_FOUND


def current_champion(client: MlflowClient, model_name: str, alias: str) -> tuple[str, str] | None:
    """(version, run id) of the version holding `alias`; None only when the registry says there
    is no such model or no version holds the alias. RegistryUnavailable otherwise."""
    from mlflow.exceptions import MlflowException

    try:
        registered = client.get_registered_model(model_name)
        version = registered.aliases.get(alias)
        if version is None:
            return None
        run_id = client.get_model_version(model_name, str(version)).run_id
        return str(version), cast("str", run_id)  # None only for a version registered without a run
    except MlflowException as exc:
        if is_not_found(exc):
            return None
        raise RegistryUnavailable(
            f"cannot read {model_name}@{alias} from the MLflow registry: {exc.message}"
        ) from exc


def champion_data_digest(client: MlflowClient, model_name: str, alias: str) -> str | None:
    """The data digest the champion was trained on (its lineage tag), None without a champion."""
    from mlflow.exceptions import MlflowException

    found = current_champion(client, model_name, alias)
    if found is None:
        return None
    version, run_id = found
    try:
        tags = client.get_model_version(model_name, version).tags
        return tags.get(DATA_DIGEST_TAG) or client.get_run(run_id).data.tags.get(DATA_DIGEST_TAG)
    except MlflowException as exc:
        raise RegistryUnavailable(
            f"cannot read the lineage of {model_name} version {version}: {exc.message}"
        ) from exc


def champion_transform(
    client: MlflowClient, model_name: str, alias: str
) -> tuple[str, dict[str, Any]] | None:
    """The champion's version and the fitted transform its run logged (`transform.json`: its
    tokenizers among it); None without a champion. A champion whose transform cannot be read is
    a RegistryError naming the version (RegistryUnavailable when the server cannot be asked)."""
    from mlflow.exceptions import MlflowException

    from airflow_trainpipe.contracts.artifacts import TRANSFORM_ARTIFACT

    found = current_champion(client, model_name, alias)
    if found is None:
        return None
    version, run_id = found
    with tempfile.TemporaryDirectory(prefix="trainpipe-champion-") as directory:
        try:
            path = client.download_artifacts(run_id, TRANSFORM_ARTIFACT, directory)
            with open(path) as file:
                return version, json.load(file)
        except (MlflowException, OSError, ValueError) as exc:
            raise RegistryError(
                f"the fitted transform of {model_name} version {version} (run {run_id}, "
                f"{TRANSFORM_ARTIFACT}) cannot be read: {exc}"
            ) from exc


def version_threshold(client: MlflowClient, model_name: str, version: str) -> float:
    """The version's own decision threshold (the training job tunes it), 0.5 for a version
    registered without one."""
    return float(client.get_model_version(model_name, version).tags.get(THRESHOLD_TAG, 0.5))


def get_run(client: MlflowClient, run_id: str) -> Any:
    """The MLflow run; RegistryError (final) when it does not exist, RegistryUnavailable otherwise."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if is_not_found(exc):
            raise RegistryError(f"MLflow run {run_id!r} not found: {exc.message}") from exc
        raise RegistryUnavailable(f"cannot read MLflow run {run_id!r}: {exc.message}") from exc


def finished_run(client: MlflowClient, run_id: str) -> Any:
    """The candidate's MLflow run, which must exist and have FINISHED (RegistryError otherwise)."""
    try:
        run = get_run(client, run_id)
    except RegistryUnavailable:
        raise
    except RegistryError as exc:
        raise RegistryError(f"candidate {exc}") from exc
    if run.info.status != "FINISHED":
        raise RegistryError(f"candidate MLflow run {run_id} is {run.info.status}, not FINISHED")
    return run


def run_evaluation(client: MlflowClient, run_id: str) -> Evaluation:
    """Candidate and champion metrics the training job logged on a finished run, with the champion
    it scored (its tags); a run that scored no champion at all is a RegistryError."""
    from airflow_trainpipe.contracts.payloads import Evaluation

    data = finished_run(client, run_id).data
    version = data.tags.get(CHAMPION_VERSION_TAG)
    if version is None:
        raise RegistryError(
            f"MLflow run {run_id} has no tag {CHAMPION_VERSION_TAG}: the champion was not scored"
        )

    def prefixed(prefix: str) -> dict[str, float]:
        return {k.removeprefix(prefix): v for k, v in data.metrics.items() if k.startswith(prefix)}

    scored = version != NO_CHAMPION
    return Evaluation(
        candidate=prefixed("candidate_"),
        champion=prefixed("champion_") if scored else None,
        champion_version=version if scored else None,
        champion_run_id=data.tags.get(CHAMPION_RUN_ID_TAG),
        champion_error=data.tags.get(CHAMPION_ERROR_TAG),
        improvement_interval=(
            (data.metrics["improvement_lower"], data.metrics["improvement_upper"])
            if "improvement_lower" in data.metrics and "improvement_upper" in data.metrics
            else None
        ),
    )


def logged_evaluation(client: MlflowClient, run_id: str) -> dict[str, Any] | None:
    """The run's evaluation.json as the job wrote it (None: a run from before it existed)."""
    from mlflow.exceptions import MlflowException

    from airflow_trainpipe.contracts.artifacts import EVALUATION_ARTIFACT

    with tempfile.TemporaryDirectory(prefix="trainpipe-evaluation-") as directory:
        try:
            path = client.download_artifacts(run_id, EVALUATION_ARTIFACT, directory)
        except (MlflowException, OSError):
            return None
        with open(path) as file:
            document: dict[str, Any] = json.load(file)
    return document
