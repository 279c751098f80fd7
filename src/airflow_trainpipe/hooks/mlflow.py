"""MlflowHook: the tracking server and model registry of an Airflow connection of type `mlflow`:
the connection, and a thin client over it.

The connection holds where MLflow is and how to authenticate; configs never do. Credentials
reach the MLflow client as the environment variables it reads itself
(MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN): in this process for the duration of a
`with hook.activated():` block, and in the training child process through `environment()`.
They are never put on a command line, in a TrainSpec, in a rendered field or in a log line, and
every secret is registered with Airflow's secrets masker (hooks/mlflow_connection.py).

Without a connection the embedded default applies: `MLFLOW_TRACKING_URI` of the worker if set,
else `sqlite:///<TRAINPIPE_HOME>/mlflow.db`, exactly what the training runtime uses.

What the registry's contents mean (which tags, which run is a candidate, when an alias may move)
is registry/'s: registry/reads.py takes a client, run here by `call(fn, ...)`, and
registry/versions.py writes through the plain operations below.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import cached_property
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_trainpipe.config.secrets import redact_uri
from airflow_trainpipe.hooks.mlflow_connection import MlflowTarget, embedded_target, target_from_connection

if TYPE_CHECKING:
    from mlflow import MlflowClient

P = ParamSpec("P")
T = TypeVar("T")


class MlflowHook(BaseHook):
    """Interact with an MLflow tracking server and model registry.

    Connection fields:

    - **host**: `http(s)://host` of the tracking server (`http://` is assumed without a scheme);
      **port** and **schema** (a path prefix, e.g. `mlflow`) are appended when set.
    - extra `tracking_uri`: any other tracking URI instead (e.g. `sqlite:////data/mlflow.db`,
      `databricks`); wins over host.
    - **login** + **password**: HTTP basic auth (`mlflow server --app-name basic-auth`).
    - **password** without login, or extra `token`: a bearer token.
    - extra `ui_url`: base URL of the MLflow UI for the extra links; defaults to the server URL.
    - extra `insecure_tls`: skip TLS verification (self-signed test servers only).

    :param mlflow_conn_id: connection id; when it is not defined, the embedded default is used.
    """

    conn_name_attr = "mlflow_conn_id"
    default_conn_name = "mlflow_default"
    conn_type = "mlflow"
    hook_name = "MLflow"

    def __init__(self, mlflow_conn_id: str | None = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mlflow_conn_id = mlflow_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": [],
            "relabeling": {
                "host": "Tracking server (http(s)://host)",
                "schema": "Path prefix",
                "login": "Username (basic auth)",
                "password": "Password (basic auth) or token",
            },
            "placeholders": {
                "host": "https://mlflow.example.com",
                "port": "5000",
                "extra": '{"ui_url": "https://mlflow.example.com", "tracking_uri": "sqlite:////data/mlflow.db"}',
            },
        }

    @cached_property
    def target(self) -> MlflowTarget:
        if not self.mlflow_conn_id:
            return embedded_target()
        try:
            conn = self.get_connection(self.mlflow_conn_id)
        except AirflowNotFoundException:
            if self.mlflow_conn_id != self.default_conn_name:
                raise  # a connection named explicitly must exist
            return embedded_target()
        return target_from_connection(conn, self.mlflow_conn_id)

    @property
    def tracking_uri(self) -> str:
        return self.target.tracking_uri

    @property
    def ui_url(self) -> str | None:
        return self.target.ui_url

    def environment(self) -> dict[str, str]:
        """Environment for a process that talks to MLflow (the training job): URI and credentials."""
        return self.target.environment()

    def activated(self) -> AbstractContextManager[None]:
        """Let MLflow clients of this process use this connection while the block runs."""
        return self.target.activated()

    def get_conn(self) -> MlflowClient:
        """An MlflowClient for this connection; call it (and use it) inside `activated()`."""
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)

    def run_url(self, experiment_id: str, run_id: str) -> str | None:
        return f"{self.ui_url}/#/experiments/{experiment_id}/runs/{run_id}" if self.ui_url else None

    def model_version_url(self, name: str, version: str | int) -> str | None:
        from urllib.parse import quote

        return f"{self.ui_url}/#/models/{quote(name)}/versions/{version}" if self.ui_url else None

    def call(self, fn: Callable[Concatenate[MlflowClient, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(client, *args, **kwargs)` with this connection active: how the tasks run registry/'s
        functions that take a client (all of registry/reads.py: the training job shares them)."""
        with self.activated():
            return fn(self.get_conn(), *args, **kwargs)

    # -- the registry's plain operations, shared by the tasks, the CLI and registry/ -------------
    # Each opens the connection for its own calls; what they mean is registry/'s business.

    def model_version(self, model_name: str, version: str) -> Any:
        """The registry's ModelVersion (its run id, its tags)."""
        with self.activated():
            return self.get_conn().get_model_version(model_name, version)

    def set_version_tags(self, model_name: str, version: str, tags: dict[str, str]) -> None:
        with self.activated():
            client = self.get_conn()
            for key, value in tags.items():
                client.set_model_version_tag(model_name, version, key, value)

    def move_alias(
        self, model_name: str, alias: str, version: str, previous_alias: str | None, holder: str | None
    ) -> str | None:
        """Point `alias` at `version`; the version that held it gets `previous_alias`. Returns it."""
        with self.activated():
            client = self.get_conn()
            previous = None
            if holder and previous_alias:
                client.set_registered_model_alias(model_name, previous_alias, holder)
                previous = holder
            client.set_registered_model_alias(model_name, alias, version)
        return previous

    def remove_alias(self, model_name: str, alias: str) -> None:
        with self.activated():
            self.get_conn().delete_registered_model_alias(model_name, alias)

    def log_page(self, run_id: str, page: str, path: str) -> str | None:
        """An HTML page as the run's artifact `path`; returns its URL in MLflow's UI, if it has one."""
        with self.activated():
            client = self.get_conn()
            client.log_text(run_id, page, path)
            experiment_id = client.get_run(run_id).info.experiment_id
        run_url = self.run_url(experiment_id, run_id)
        return f"{run_url}/artifacts/{path}" if run_url else None

    def mark_run_failed(self, run_id: str) -> None:
        """FAILED, unless the run already ended (a job that marked itself)."""
        with self.activated():
            client = self.get_conn()
            if client.get_run(run_id).info.status == "RUNNING":
                client.set_terminated(run_id, status="FAILED")

    def test_connection(self) -> tuple[bool, str]:
        try:
            with self.activated():
                self.get_conn().search_experiments(max_results=1)
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"reached MLflow at {redact_uri(self.tracking_uri)}"
