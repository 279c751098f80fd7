"""Where MLflow keeps runs when no server is configured: the embedded default store.

Shared by the training job (its tracker), the tasks' hook, `trainpipe tune` and the tests, so it
sits on the ground floor: it reads TRAINPIPE_HOME and nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow_trainpipe.core.storage import trainpipe_home

# Task logs are files, not terminals: there MLflow's artifact progress bars (tqdm) print a line at
# each refresh ("Downloading artifacts:   0%|          | 0/1"), three per download. The job and
# the tasks' hook turn them off unless the deployment set this.
PROGRESS_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


def default_tracking_uri() -> str:
    """The embedded default: an SQLite file under TRAINPIPE_HOME."""
    home = trainpipe_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'mlflow.db'}"


def use_tracking_uri() -> str:
    """Make the job's MLflow tracking URI (MLFLOW_TRACKING_URI, else the embedded default) this
    process's, for the client and MLflow's fluent API alike (log_model), and return it. Through
    the environment variable, which MLflow reads when nothing in this process set another:
    `mlflow.set_tracking_uri` also resets MLflow's tracer provider, which imports OpenTelemetry's
    metrics SDK for traces a job never writes (0.4 s of a forked job's start)."""
    import mlflow

    uri = os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    os.environ["MLFLOW_TRACKING_URI"] = uri
    if mlflow.get_tracking_uri() != uri:  # one this process set before outranks the environment
        mlflow.set_tracking_uri(uri)
    return uri


def artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts.

    A database-backed store without a server defaults artifacts to ``./mlruns`` relative to the
    process's working directory, which scatters them wherever a job happened to start; keep them
    next to the database instead. A tracking server chooses for itself (None).
    """
    if not tracking_uri.startswith("sqlite:///"):
        return None
    database = Path(tracking_uri.removeprefix("sqlite:///"))
    return (database.parent / "mlartifacts" / experiment).as_uri()


def experiment_id_of(client: Any, experiment: str, tracking_uri: str) -> str:
    """The id of the experiment named `experiment`, created when missing.

    Two jobs of one pipeline can start at once (runs with `max_active_runs` above 1, a study's
    trials): both find no experiment and both create it, and the store refuses the second
    (RESOURCE_ALREADY_EXISTS, a unique name). The loser reads the winner's.
    """
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(experiment)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(
            client.create_experiment(
                experiment, artifact_location=artifact_location(tracking_uri, experiment)
            )
        )
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        found = client.get_experiment_by_name(experiment)
        if found is None:  # created and deleted in between: nothing of ours to log into
            raise
        return str(found.experiment_id)
