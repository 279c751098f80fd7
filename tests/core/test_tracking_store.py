"""core.tracking_store: the experiment two jobs of one pipeline create at the same moment."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from airflow_trainpipe.core.tracking_store import experiment_id_of


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"  # created once: ~8 s of migrations


def test_the_job_that_loses_the_race_to_create_the_experiment_logs_into_the_winners(uri: str) -> None:
    # The interleaving of two jobs starting at once on a real store: the first looks the name up
    # and finds nothing, the second creates it, then the first creates it too. A store refuses
    # the second create (RESOURCE_ALREADY_EXISTS): a train task of a pipeline with two runs at
    # once failed there on the e2e stack.
    loser, winner = MlflowClient(uri), MlflowClient(uri)
    looked_up = loser.get_experiment_by_name
    created: list[str] = []

    def racing_lookup(name: str):
        found = looked_up(name)
        if found is None and not created:
            created.append(winner.create_experiment(name))
        return found

    loser.get_experiment_by_name = racing_lookup  # type: ignore[method-assign]
    assert experiment_id_of(loser, "fraud_pooled", uri) == created[0]
    assert experiment_id_of(winner, "fraud_pooled", uri) == created[0]  # found, nothing created


def test_another_refusal_is_not_taken_for_the_race(uri: str) -> None:
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException, match="Invalid experiment name"):
        experiment_id_of(MlflowClient(uri), "", uri)


_USE_URI = """
import json, os, sys
import mlflow
from mlflow import MlflowClient
from airflow_trainpipe.core.tracking_store import use_tracking_uri

os.environ["MLFLOW_TRACKING_URI"] = "sqlite:////tmp/trainpipe-a/mlflow.db"  # the job's, as its launcher gives it
returned = use_tracking_uri()
first = [returned, mlflow.get_tracking_uri(), MlflowClient().tracking_uri, "opentelemetry.sdk.metrics" in sys.modules]
mlflow.set_tracking_uri("sqlite:////tmp/trainpipe-b/mlflow.db")  # set in this process: outranks the environment
os.environ["MLFLOW_TRACKING_URI"] = "sqlite:////tmp/trainpipe-a/mlflow.db"  # ...which the job's says again
use_tracking_uri()
print(json.dumps({"first": first, "after_another": [mlflow.get_tracking_uri(), MlflowClient().tracking_uri]}))
"""


def test_the_tracking_uri_is_used_by_the_client_and_the_fluent_api_without_a_tracer_reset() -> None:
    """In an interpreter of its own: the tracer provider and the environment are process state."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [sys.executable, "-c", _USE_URI], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    a = "sqlite:////tmp/trainpipe-a/mlflow.db"
    # mlflow.set_tracking_uri would have imported OpenTelemetry's metrics SDK (its tracer reset).
    assert found["first"] == [a, a, a, False]
    assert found["after_another"] == [a, a]
