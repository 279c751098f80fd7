"""MlflowHook: the tracking server (and model registry) of an Airflow connection of type `mlflow`.

The connection holds where MLflow is and how to authenticate; configs never do. Credentials
reach the MLflow client as the environment variables it reads itself
(MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN): in this process for the duration of a
`with hook.activated():` block, and in the training child process through `environment()`.
They are never put on a command line, in a TrainSpec, in a rendered field or in a log line, and
every secret is registered with Airflow's secrets masker.

Without a connection the embedded default applies: `MLFLOW_TRACKING_URI` of the worker if set,
else `sqlite:///<TRAINPIPE_HOME>/mlflow.db`, exactly what the training runtime uses.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_trainpipe.config.secrets import redact_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
CREDENTIAL_ENVS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_INSECURE_TLS")


@dataclass(frozen=True)
class MlflowTarget:
    """Where MLflow is, how to reach its UI, and the environment that authenticates a client."""

    tracking_uri: str = field(repr=False)  # may carry user:password@
    ui_url: str | None
    credentials: dict[str, str] = field(default_factory=dict, repr=False)
    conn_id: str | None = None

    def environment(self) -> dict[str, str]:
        return {TRACKING_URI_ENV: self.tracking_uri, **self.credentials}


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
            return self._embedded()
        try:
            conn = self.get_connection(self.mlflow_conn_id)
        except AirflowNotFoundException:
            if self.mlflow_conn_id != self.default_conn_name:
                raise  # a connection named explicitly must exist
            return self._embedded()
        return self._from_connection(conn)

    @staticmethod
    def _embedded() -> MlflowTarget:
        from airflow_trainpipe.runtime.tracking import default_tracking_uri

        return MlflowTarget(tracking_uri=os.environ.get(TRACKING_URI_ENV) or default_tracking_uri(), ui_url=None)

    def _from_connection(self, conn: Any) -> MlflowTarget:
        from airflow.sdk.log import mask_secret

        extra = conn.extra_dejson
        if extra.get("tracking_uri"):
            tracking_uri = str(extra["tracking_uri"])
        elif conn.host:
            host = conn.host if "://" in conn.host else f"http://{conn.host}"
            base = host.rstrip("/") + (f":{conn.port}" if conn.port else "")
            tracking_uri = base + (f"/{conn.schema.strip('/')}" if conn.schema else "")
        else:
            raise ValueError(f"connection {self.mlflow_conn_id!r} has neither a host nor an extra 'tracking_uri'")
        credentials: dict[str, str] = {}
        token = extra.get("token")
        if conn.login:
            credentials["MLFLOW_TRACKING_USERNAME"] = conn.login
            if conn.password:
                credentials["MLFLOW_TRACKING_PASSWORD"] = conn.password
        elif conn.password:
            token = token or conn.password
        if token:
            credentials["MLFLOW_TRACKING_TOKEN"] = str(token)
        if extra.get("insecure_tls"):
            credentials["MLFLOW_TRACKING_INSECURE_TLS"] = "true"
        for name in ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
            if name in credentials:
                mask_secret(credentials[name])
        if password := urlsplit(tracking_uri).password:  # user:password@ written into the URI itself
            mask_secret(password)
        ui_url = extra.get("ui_url") or (tracking_uri if tracking_uri.startswith(("http://", "https://")) else None)
        # The UI URL goes into extra links (stored, shown to every viewer): never with credentials.
        return MlflowTarget(tracking_uri=tracking_uri, ui_url=redact_uri(ui_url).rstrip("/") if ui_url else None,
                            credentials=credentials, conn_id=self.mlflow_conn_id)

    @property
    def tracking_uri(self) -> str:
        return self.target.tracking_uri

    @property
    def ui_url(self) -> str | None:
        return self.target.ui_url

    def environment(self) -> dict[str, str]:
        """Environment for a process that talks to MLflow (the training job): URI and credentials."""
        return self.target.environment()

    @contextmanager
    def activated(self) -> Iterator[None]:
        """Let MLflow clients of this process use this connection while the block runs.

        MLflow reads credentials from the environment on every request, so they are set for
        the block and the previous values restored afterwards.
        """
        # MLflow's own registry store resolves logged models through a default MlflowClient(),
        # i.e. the process-wide tracking URI: set that too, not just this hook's client.
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri

        wanted = self.environment()
        saved = {name: os.environ.get(name) for name in (TRACKING_URI_ENV, *CREDENTIAL_ENVS)}
        for name in CREDENTIAL_ENVS:
            os.environ.pop(name, None)
        os.environ.update(wanted)
        try:
            with _use_tracking_uri(self.tracking_uri):
                yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def get_conn(self) -> MlflowClient:
        """An MlflowClient for this connection; call it (and use it) inside `activated()`."""
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)

    def run_url(self, experiment_id: str, run_id: str) -> str | None:
        return f"{self.ui_url}/#/experiments/{experiment_id}/runs/{run_id}" if self.ui_url else None

    def model_version_url(self, name: str, version: str | int) -> str | None:
        from urllib.parse import quote

        return f"{self.ui_url}/#/models/{quote(name)}/versions/{version}" if self.ui_url else None

    def test_connection(self) -> tuple[bool, str]:
        try:
            with self.activated():
                self.get_conn().search_experiments(max_results=1)
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"reached MLflow at {redact_uri(self.tracking_uri)}"
