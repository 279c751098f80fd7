"""A real `mlflow server` for the tests: 127.0.0.1, a free port, sqlite backend, local artifacts,
one worker, HTTP basic auth (`--app-name basic-auth`) with an admin password only the test knows."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port


@dataclass
class MlflowServer:
    url: str
    username: str
    password: str
    root: Path
    process: subprocess.Popen[bytes]
    backend_store_uri: str = ""

    def connection_json(self) -> str:
        """An Airflow connection (AIRFLOW_CONN_<ID> JSON) of type mlflow with basic auth."""
        import json

        host, port = self.url.removeprefix("http://").split(":")
        return json.dumps(
            {
                "conn_type": "mlflow",
                "host": f"http://{host}",
                "port": int(port),
                "login": self.username,
                "password": self.password,
            }
        )

    def wait_healthy(self, timeout: float = 120.0) -> None:
        """Until /health answers; a server that exits or stays unhealthy is stopped, with its log."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with {self.process.returncode}:\n{self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                stop_mlflow_server(self.process)
                raise RuntimeError(f"mlflow server not healthy after {timeout}s:\n{self._log_tail()}")
            time.sleep(0.3)

    def _log_tail(self) -> str:
        return (self.root / "server.log").read_text()[-3000:]

    def client_env(self) -> dict[str, str]:
        return {
            "MLFLOW_TRACKING_URI": self.url,
            "MLFLOW_TRACKING_USERNAME": self.username,
            "MLFLOW_TRACKING_PASSWORD": self.password,
        }


def start_mlflow_server(
    root: Path, timeout: float = 120.0, *, wait: bool = True, backend_store_uri: str | None = None
) -> MlflowServer:
    """Start the server; with `wait=False` return at once and call `wait_healthy` later (the e2e
    stack starts Airflow meanwhile: on 2 cores the two startups overlap by several seconds).
    `backend_store_uri`: e.g. PostgreSQL, as production runs it (default: sqlite under `root`)."""
    root.mkdir(parents=True, exist_ok=True)
    password = "pw-" + secrets.token_hex(12)
    auth_ini = root / "basic_auth.ini"
    auth_ini.write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{root / 'auth.db'}\nadmin_username = admin\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        # Without the cache every request pays a PBKDF2 hash (~1 s on a busy 2-core machine).
        "auth_cache_ttl_seconds = 3600\n"
    )
    server = MlflowServer(
        url=f"http://127.0.0.1:{free_port()}",
        username="admin",
        password=password,
        root=root,
        process=None,  # type: ignore[arg-type] - set by _launch
        backend_store_uri=backend_store_uri or f"sqlite:///{root / 'mlflow.db'}",
    )
    _launch(server)
    if wait:
        server.wait_healthy(timeout)
    return server


def restart_mlflow_server(server: MlflowServer, down_s: float = 0.0, timeout: float = 120.0) -> None:
    """Stop the server, wait `down_s`, start it again on the same port with the same backend
    store, artifacts and admin credentials (its auth database keeps them)."""
    stop_mlflow_server(server.process)
    time.sleep(down_s)
    _launch(server)
    server.wait_healthy(timeout)


def _launch(server: MlflowServer) -> None:
    root = server.root
    env = {
        **os.environ,
        "MLFLOW_AUTH_CONFIG_PATH": str(root / "basic_auth.ini"),
        "MLFLOW_AUTH_ADMIN_PASSWORD": server.password,
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
        # MLflow 3.17 starts a job runner beside the server (Huey consumers, each importing
        # mlflow) that nothing here uses: without it a start takes 7.2 s instead of 12.9 s.
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(name, None)
    mlflow_cli = Path(sys.executable).parent / "mlflow"
    log = open(root / "server.log", "ab")  # noqa: SIM115 - kept open for the server's lifetime
    server.process = subprocess.Popen(
        [
            str(mlflow_cli),
            "server",
            "--app-name",
            "basic-auth",
            "--host",
            "127.0.0.1",
            "--port",
            server.url.rsplit(":", 1)[1],
            "--backend-store-uri",
            server.backend_store_uri,
            "--artifacts-destination",
            str(root / "artifacts"),
            "--workers",
            "1",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_mlflow_server(process: subprocess.Popen[bytes]) -> None:
    import signal

    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)  # its own session: uvicorn and its worker
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def log_candidate_run(
    experiment: str,
    candidate: dict[str, float],
    champion: dict[str, float] | None,
    champion_version: str | None,
    *,
    model_name: str,
    tags: dict[str, str] | None = None,
) -> str:
    """A finished MLflow run shaped like the training job's: a small real logged torch model,
    `candidate_<metric>` / `champion_<metric>` and the champion tags. Uses the current tracking
    URI and credentials of this process (call it inside `MlflowHook.activated()`)."""
    import mlflow
    import numpy as np
    import torch

    from airflow_trainpipe.core.tracking_store import artifact_location

    found = mlflow.get_experiment_by_name(experiment)
    experiment_id = (
        found.experiment_id
        if found is not None
        # the embedded store keeps artifacts by its db
        else mlflow.create_experiment(
            experiment, artifact_location=artifact_location(mlflow.get_tracking_uri(), experiment)
        )
    )
    # Not set_experiment: it would leave the id in mlflow's globals and MLFLOW_EXPERIMENT_ID.
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_metrics({f"candidate_{k}": v for k, v in candidate.items()})
        if champion is not None:
            mlflow.log_metrics({f"champion_{k}": v for k, v in champion.items()})
        mlflow.set_tags(
            {
                "trainpipe.champion.model_name": model_name,
                "trainpipe.champion.alias": "champion",
                "trainpipe.champion.version": champion_version or "none",
                "trainpipe.data_digest": "sha256:" + "ab" * 32,
                **(tags or {}),
            }
        )
        model = torch.nn.Linear(3, 1)
        # export_model=False and fixed requirements: 0.3 s instead of ~8 s per model.
        mlflow.pytorch.log_model(
            model,
            name="model",
            input_example=np.zeros((2, 3), np.float32),
            export_model=False,
            pip_requirements=["torch"],
        )
    return run.info.run_id
