"""The local canary backend: champion and candidate under `mlflow models serve` on 127.0.0.1, the
weighted router (canary/router.py) in front, everything detached from the task process.

Detached (own sessions, no parent-death signal) because a canary outlives the task that starts it:
its steps wait in the triggerer for minutes or hours, a worker or the scheduler may restart in the
middle, and the next task finds the processes by the pids in `deployment.json`. That file and the
router's request log are the canary's whole state.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from airflow_trainpipe.canary.router import REQUESTS_FILE, ROUTER_FILE
from airflow_trainpipe.canary.state_files import write_json
from airflow_trainpipe.config.canary import LocalServing
from airflow_trainpipe.core.exceptions import TrainpipeError

DEPLOYMENT_FILE = "deployment.json"
# The processes this interpreter started, kept so that it reaps what it stops (no zombies) and
# Python does not warn about a child still running when its handle goes: that is the design.
_STARTED: dict[int, subprocess.Popen[bytes]] = {}
START_TIMEOUT_S = 120.0  # `mlflow models serve` downloads the model and imports torch first


class ServingError(TrainpipeError):
    """A model server or the router did not start or stopped answering."""

    retryable = True


@dataclass
class Process:
    url: str
    pid: int
    model_uri: str = ""


class LocalCanary:
    """`state`: this canary's folder (one per pipeline and version); `env`: the model servers'
    environment (the MLflow tracking URI and credentials, for `models:/` URIs)."""

    def __init__(self, state: Path, settings: LocalServing, env: dict[str, str] | None = None):
        self.state, self.settings = state, settings
        bin_dir = str(Path(sys.executable).parent)
        # The server execs `uvicorn` by name: the interpreter's own bin/ must be on PATH.
        self.env = {**os.environ, **(env or {}), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}

    @property
    def requests_log(self) -> Path:
        return self.state / REQUESTS_FILE

    def deployment(self) -> dict[str, Process]:
        try:
            stored = json.loads((self.state / DEPLOYMENT_FILE).read_text())
        except FileNotFoundError:
            return {}
        return {name: Process(**fields) for name, fields in stored.items()}

    def start(self, champion_uri: str, candidate_uri: str) -> str:
        """Both models and the router, started once: a rerun finds them (alive) and reuses them.
        Returns the router's URL, where clients send their requests."""
        self.state.mkdir(parents=True, exist_ok=True)
        running = self.deployment()
        servers_alive = {"champion", "candidate"} <= running.keys() and all(
            _alive(running[role].pid) for role in ("champion", "candidate")
        )
        if servers_alive and _alive(running["router"].pid):
            return running["router"].url
        if servers_alive:  # only the router died: a new one resumes the share from weight.json
            router = self._route(running["champion"].url, running["candidate"].url)
            self._save({**running, "router": router})
            return router.url
        self.stop()
        servers = {
            "champion": self._serve(champion_uri, "champion"),
            "candidate": self._serve(candidate_uri, "candidate"),
        }
        try:
            for role, server in servers.items():
                self._wait_ready(server, role)
            router = self._route(servers["champion"].url, servers["candidate"].url)
        except ServingError:
            for server in servers.values():  # not in deployment.json yet: stop() cannot see them
                _terminate(server.pid)
            raise
        self._save({**servers, "router": router})
        return router.url

    def set_percent(self, percent: float) -> None:
        """The candidate's share of the traffic, from now on."""
        self._router_call("PUT", "/canary/weight", {"percent": percent})

    def rollback(self) -> None:
        """All traffic back on the champion; the candidate's server stops."""
        self.set_percent(0.0)
        self._stop_role("candidate")

    def promote(self) -> None:
        """All traffic on the candidate; the old champion's server stops."""
        self.set_percent(100.0)
        self._stop_role("champion")

    def stop(self) -> None:
        """Every process of this canary (the request log stays: it is the evidence)."""
        for process in self.deployment().values():
            _terminate(process.pid)
        (self.state / DEPLOYMENT_FILE).unlink(missing_ok=True)
        (self.state / ROUTER_FILE).unlink(missing_ok=True)

    # -- private steps ---------------------------------------------------------------------------

    def _serve(self, model_uri: str, role: str) -> Process:
        port = _free_port(self.settings.host)
        command = [
            str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m", model_uri,
            "--env-manager", "local", "-h", self.settings.host, "-p", str(port), "-w", "1",
        ]  # fmt: skip
        process = _detached(command, self.env, self.state / f"{role}.log")
        return Process(url=f"http://{self.settings.host}:{port}", pid=process.pid, model_uri=model_uri)

    def _wait_ready(self, server: Process, role: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not _alive(server.pid):
                break
            try:
                with urllib.request.urlopen(f"{server.url}/ping", timeout=2) as response:
                    if response.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                time.sleep(0.5)
        _terminate(server.pid)
        tail = _tail(self.state / f"{role}.log")
        raise ServingError(
            f"the {role} model {server.model_uri} did not start serving at {server.url}:\n{tail}"
        )

    def _route(self, champion: str, candidate: str) -> Process:
        (self.state / ROUTER_FILE).unlink(missing_ok=True)
        command = [
            sys.executable, "-m", "airflow_trainpipe.canary.router", "--state", str(self.state),
            "--champion", champion, "--candidate", candidate, "--host", self.settings.host,
            "--port", str(self.settings.port), "--timeout-s", str(self.settings.timeout_s),
        ]  # fmt: skip
        process = _detached(command, self.env, self.state / "router.log")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            if (self.state / ROUTER_FILE).exists():
                return Process(**json.loads((self.state / ROUTER_FILE).read_text()))
            time.sleep(0.1)
        raise ServingError(f"the canary router did not start:\n{_tail(self.state / 'router.log')}")

    def _router_call(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        router = self.deployment().get("router")
        if router is None:
            raise ServingError(f"no canary router is running for {self.state}")
        request = urllib.request.Request(
            f"{router.url}{path}", data=json.dumps(body).encode(), method=method,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answer: dict[str, Any] = json.loads(response.read())
                return answer
        except (OSError, urllib.error.URLError) as exc:
            raise ServingError(
                f"the canary router at {router.url} did not answer {method} {path}: {exc}"
            ) from exc

    def _stop_role(self, role: str) -> None:
        deployment = self.deployment()
        if (process := deployment.pop(role, None)) is not None:
            _terminate(process.pid)
            self._save(deployment)

    def _save(self, deployment: dict[str, Process]) -> None:
        write_json(self.state / DEPLOYMENT_FILE, {name: asdict(p) for name, p in deployment.items()})


def _detached(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A process in a session of its own: it outlives the task; stop() ends it by pid."""
    with log.open("ab") as output:
        process = subprocess.Popen(
            command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    _STARTED[process.pid] = process
    return process


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (an exited child not yet reaped) is not serving
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _terminate(pid: int, grace_s: float = 10.0) -> None:
    """The process's whole session (a server's uvicorn workers too), politely and then not."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if not _alive(pid):
            if (child := _STARTED.pop(pid, None)) is not None:
                child.wait()
            return


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
