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

    from airflow_trainpipe.contracts.payloads import Evaluation, GateDecision

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
NO_CHAMPION = "none"  # the training job's trainpipe.champion.version when nothing held the alias
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
        from airflow_trainpipe.core.tracking_store import default_tracking_uri

        return MlflowTarget(
            tracking_uri=os.environ.get(TRACKING_URI_ENV) or default_tracking_uri(), ui_url=None
        )

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
            from airflow_trainpipe.core.registry_reads import RegistryError

            raise RegistryError(
                f"connection {self.mlflow_conn_id!r} has neither a host nor an extra 'tracking_uri'"
            )
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
        # The UI URL goes into extra links (stored, shown to every viewer): never with credentials.
        return MlflowTarget(
            tracking_uri=tracking_uri,
            ui_url=redact_uri(ui_url).rstrip("/") if ui_url else None,
            credentials=credentials,
            conn_id=self.mlflow_conn_id,
        )

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

    # -- registry and tracking operations of the tasks ----------------------------------------
    # Each opens the connection for its own calls. Lookups say "not there" only on MLflow's own
    # answer (RegistryError, final) and raise RegistryUnavailable otherwise (retried).

    def model_version(self, model_name: str, version: str) -> Any:
        """The registry's ModelVersion (its run id, its tags)."""
        with self.activated():
            return self.get_conn().get_model_version(model_name, version)

    def current_champion(self, model_name: str, alias: str) -> tuple[str, str] | None:
        """(version, run id) holding `alias`, or None when no version does."""
        from airflow_trainpipe.core.registry_reads import current_champion

        with self.activated():
            return current_champion(self.get_conn(), model_name, alias)

    def champion_data_digest(self, model_name: str, alias: str) -> str | None:
        """The data digest the champion was trained on (its lineage tag), None without a champion."""
        from airflow_trainpipe.core.registry_reads import champion_data_digest

        with self.activated():
            return champion_data_digest(self.get_conn(), model_name, alias)

    def champion_transform(self, model_name: str, alias: str) -> tuple[str, dict[str, Any]] | None:
        """The champion's version and the fitted transform its run logged (`transform.json`: its
        tokenizers among it); None without a champion. A champion whose transform cannot be read is
        a RegistryError naming the version (RegistryUnavailable when the server cannot be asked)."""
        import json
        import tempfile

        from mlflow.exceptions import MlflowException

        from airflow_trainpipe.contracts.artifacts import TRANSFORM_ARTIFACT
        from airflow_trainpipe.core.registry_reads import RegistryError, current_champion

        with self.activated(), tempfile.TemporaryDirectory(prefix="trainpipe-champion-") as directory:
            found = current_champion(self.get_conn(), model_name, alias)
            if found is None:
                return None
            version, run_id = found
            try:
                path = self.get_conn().download_artifacts(run_id, TRANSFORM_ARTIFACT, directory)
                with open(path) as file:
                    return version, json.load(file)
            except (MlflowException, OSError, ValueError) as exc:
                raise RegistryError(
                    f"the fitted transform of {model_name} version {version} (run {run_id}, "
                    f"{TRANSFORM_ARTIFACT}) cannot be read: {exc}"
                ) from exc

    def finished_run(self, run_id: str) -> Any:
        """The candidate's MLflow run, which must exist and have FINISHED."""
        from airflow_trainpipe.core.registry_reads import RegistryError, RegistryUnavailable, get_run

        with self.activated():
            try:
                run = get_run(self.get_conn(), run_id)
            except RegistryUnavailable:
                raise
            except RegistryError as exc:
                raise RegistryError(f"candidate {exc}") from exc
        if run.info.status != "FINISHED":
            raise RegistryError(f"candidate MLflow run {run_id} is {run.info.status}, not FINISHED")
        return run

    def run_evaluation(self, run_id: str) -> Evaluation:
        """Candidate and champion metrics the training job logged on a finished run."""
        from airflow_trainpipe.contracts.payloads import Evaluation
        from airflow_trainpipe.core.registry_reads import RegistryError

        data = self.finished_run(run_id).data
        version = data.tags.get("trainpipe.champion.version")
        if version is None:
            raise RegistryError(
                f"MLflow run {run_id} has no tag trainpipe.champion.version: the champion was not scored"
            )

        def prefixed(prefix: str) -> dict[str, float]:
            return {k.removeprefix(prefix): v for k, v in data.metrics.items() if k.startswith(prefix)}

        scored = version != NO_CHAMPION
        return Evaluation(
            candidate=prefixed("candidate_"),
            champion=prefixed("champion_") if scored else None,
            champion_version=version if scored else None,
            champion_run_id=data.tags.get("trainpipe.champion.run_id"),
            champion_error=data.tags.get("trainpipe.champion.error"),
            improvement_interval=(
                (data.metrics["improvement_lower"], data.metrics["improvement_upper"])
                if "improvement_lower" in data.metrics and "improvement_upper" in data.metrics
                else None
            ),
        )

    def logged_evaluation(self, run_id: str) -> dict[str, Any] | None:
        """The run's evaluation.json as the job wrote it (None: a run from before it existed)."""
        import json
        import tempfile

        from mlflow.exceptions import MlflowException

        from airflow_trainpipe.contracts.artifacts import EVALUATION_ARTIFACT

        with self.activated(), tempfile.TemporaryDirectory(prefix="trainpipe-evaluation-") as directory:
            try:
                path = self.get_conn().download_artifacts(run_id, EVALUATION_ARTIFACT, directory)
            except (MlflowException, OSError):
                return None
            with open(path) as file:
                document: dict[str, Any] = json.load(file)
        return document

    def record_gate_decision(
        self, run_id: str, decision: GateDecision, figure: Any, report: str
    ) -> str | None:
        """The decision as an artifact and tags of the candidate's run, with its chart and its
        HTML report (registry/gate_report.py); returns the report's URL in MLflow's UI, if it has one."""
        from airflow_trainpipe.contracts.artifacts import REPORT_PATH

        with self.activated():
            client = self.get_conn()
            client.log_dict(run_id, decision.as_dict(), "gate/decision.json")
            client.set_tag(run_id, "trainpipe.gate.promote", str(decision.promote).lower())
            client.set_tag(run_id, "trainpipe.gate.forced", str(decision.forced).lower())
            client.set_tag(run_id, "trainpipe.gate.reason", decision.reason[:5000])
            client.log_figure(run_id, figure, "gate/comparison.png")
        return self.log_page(run_id, report, REPORT_PATH)

    def log_page(self, run_id: str, page: str, path: str) -> str | None:
        """An HTML page as the run's artifact `path`; returns its URL in MLflow's UI, if it has one."""
        with self.activated():
            client = self.get_conn()
            client.log_text(run_id, page, path)
            experiment_id = client.get_run(run_id).info.experiment_id
        run_url = self.run_url(experiment_id, run_id)
        return f"{run_url}/artifacts/{path}" if run_url else None

    def find_or_create_version(self, model_name: str, run: Any, description: str) -> tuple[str, bool]:
        """The model version of `run` (created when there is none yet): (version, created).

        Looked up by run id first, so a retry or a re-run never registers a second version.
        """
        from mlflow.exceptions import MlflowException

        from airflow_trainpipe.core.registry_reads import RegistryError

        run_id = run.info.run_id
        with self.activated():
            client = self.get_conn()
            try:
                client.create_registered_model(model_name, description=description)
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            existing = client.search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
            if existing:
                return str(min(existing, key=lambda v: int(v.version)).version), False
            outputs = run.outputs.model_outputs if run.outputs else []
            if not outputs:
                raise RegistryError(f"MLflow run {run_id} logged no model to register")
            model_id = outputs[-1].model_id
            version = client.create_model_version(
                name=model_name, source=f"models:/{model_id}", run_id=run_id, model_id=model_id
            )
        return str(version.version), True

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
