"""An Airflow connection of type `mlflow` read into an `MlflowTarget`: where MLflow is, its UI,
and the environment variables that authenticate a client (MlflowHook's fields, documented there),
set in this process while `activated()` runs.

Credentials only ever travel as that environment (MLFLOW_TRACKING_USERNAME / _PASSWORD / _TOKEN,
the variables the MLflow client reads itself), never on a command line or in a log line; every
secret, a password written into the tracking URI too, is registered with Airflow's secrets
masker here, when the connection is read. The UI URL goes into extra links, which every viewer
sees, so it never carries credentials.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from airflow_trainpipe.config.secrets import redact_uri
from airflow_trainpipe.core.tracking_store import PROGRESS_BAR_ENV

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
CREDENTIAL_ENVS = (
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_INSECURE_TLS",
)


@dataclass(frozen=True)
class MlflowTarget:
    """Where MLflow is, how to reach its UI, and the environment that authenticates a client."""

    tracking_uri: str = field(repr=False)  # may carry user:password@
    ui_url: str | None
    credentials: dict[str, str] = field(default_factory=dict, repr=False)
    conn_id: str | None = None

    def environment(self) -> dict[str, str]:
        return {TRACKING_URI_ENV: self.tracking_uri, **self.credentials}

    @contextmanager
    def activated(self) -> Iterator[None]:
        """Let MLflow clients of this process use this target while the block runs.

        MLflow reads credentials from the environment on every request, so they are set for
        the block and the previous values restored afterwards.
        """
        # MLflow's own registry store resolves logged models through a default MlflowClient(),
        # i.e. the process-wide tracking URI: set that too, not just this hook's client.
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri

        saved = {
            name: os.environ.get(name) for name in (TRACKING_URI_ENV, *CREDENTIAL_ENVS, PROGRESS_BAR_ENV)
        }
        for name in CREDENTIAL_ENVS:
            os.environ.pop(name, None)
        os.environ.update(self.environment())
        os.environ.setdefault(PROGRESS_BAR_ENV, "false")
        try:
            with _use_tracking_uri(self.tracking_uri):
                yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def embedded_target() -> MlflowTarget:
    """No connection: the worker's `MLFLOW_TRACKING_URI`, else the store under TRAINPIPE_HOME
    (exactly what the training runtime uses)."""
    from airflow_trainpipe.core.tracking_store import default_tracking_uri

    return MlflowTarget(tracking_uri=os.environ.get(TRACKING_URI_ENV) or default_tracking_uri(), ui_url=None)


def target_from_connection(conn: Any, conn_id: str) -> MlflowTarget:
    """The target of connection `conn_id` (extra `tracking_uri`, else host, port and schema);
    a connection with neither is a RegistryError naming it."""
    from airflow.sdk.log import mask_secret

    extra = conn.extra_dejson
    if extra.get("tracking_uri"):
        tracking_uri = str(extra["tracking_uri"])
    elif conn.host:
        host = conn.host if "://" in conn.host else f"http://{conn.host}"
        base = host.rstrip("/") + (f":{conn.port}" if conn.port else "")
        tracking_uri = base + (f"/{conn.schema.strip('/')}" if conn.schema else "")
    else:
        from airflow_trainpipe.core.exceptions import RegistryError

        raise RegistryError(f"connection {conn_id!r} has neither a host nor an extra 'tracking_uri'")
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
    ui_url = extra.get("ui_url") or (
        tracking_uri if tracking_uri.startswith(("http://", "https://")) else None
    )
    return MlflowTarget(
        tracking_uri=tracking_uri,
        ui_url=redact_uri(ui_url).rstrip("/") if ui_url else None,
        credentials=credentials,
        conn_id=conn_id,
    )
