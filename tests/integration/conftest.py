"""The end-to-end stack, started once for this package: `airflow standalone` (api-server,
scheduler, dag-processor, triggerer on SQLite) started the way `make up` starts it, and a real
`mlflow server` with basic auth, both on loopback ports. Startup is the expensive part (minutes
on 2 cores), so the e2e modules using it share one stack; they run in file order and share its
dags folder (a tmp copy of the repo's loader and configs), its data and its MLflow registry.

Idle, the stack's processes still take 17% of a core (10.1 CPU s in 60 s, measured 2026-11-29),
which the tests running beside it would share. So it is started as late and stopped as early as
it can be: the modules using it run last in this package, one after the other (the
`dag.test()` scenarios and the modules with a stack of their own run before it starts,
`pytest_collection_modifyitems` below), and it stops after the package's last test, before
tests/launchers ... tests/tuning.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import pytest
import requests

from tests.conftest import REPO_ROOT, free_port
from tests.helpers.smtp_server import SmtpServer

PARTITION = date(
    2026, 1, 3
)  # the last of the days written for the REST test; the day before is its drift reference
BROKEN_FILE = "fraud_broken.yaml"
APPROVAL_PIPELINE = "fraud_approval"  # register.approval: required, notify: the stack's SMTP server
ADMIN_PASSWORD = "e2e-admin-pw"
ROWS_PER_DAY = 10_000
ARTIFACTS = REPO_ROOT / "var" / "test-artifacts"  # gitignored; what a failed browser test saw
BUCKET = "trainpipe"  # on the stack's moto S3 server


def load_up():
    """scripts/up.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("trainpipe_up", REPO_ROOT / "scripts" / "up.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Stack:
    url: str
    session: requests.Session
    configs: Path
    airflow_home: Path
    home: Path  # TRAINPIPE_HOME of the Airflow processes
    mlflow: object  # tests.helpers.mlflow_server.MlflowServer
    smtp: object  # tests.helpers.smtp_server.SmtpServer, Airflow's smtp_default
    s3: object = None  # tests.helpers.moto_server.MotoServer (bucket BUCKET), AWS_* of every Airflow process
    username: str = "admin"
    password: str = ADMIN_PASSWORD
    airflow: subprocess.Popen[bytes] | None = None  # the running `airflow standalone`
    airflow_env: dict[str, str] = field(default_factory=dict)
    database: str = "sqlite"  # the metadata database: "sqlite" or "postgres"
    database_url: str = ""  # its SQLAlchemy URL, as Airflow has it
    postgres: object = None  # tests.helpers.postgres.PostgresCluster holding it (database="postgres")

    def database_connect(self):
        """A connection to the metadata database itself (psycopg for PostgreSQL, sqlite3 for SQLite),
        to check what Airflow wrote beside its REST API."""
        if self.database == "postgres":
            import psycopg

            return psycopg.connect(self.database_url.replace("postgresql+psycopg://", "postgresql://", 1))
        import sqlite3

        return contextlib.closing(sqlite3.connect(self.database_url.removeprefix("sqlite:///")))

    def sign_in(self) -> None:
        token = requests.post(
            f"{self.url}/auth/token", json={"username": self.username, "password": self.password}, timeout=30
        )
        assert token.status_code == 201, token.text
        self.session.headers["Authorization"] = f"Bearer {token.json()['access_token']}"

    def restart_airflow(self) -> None:
        """Stop `airflow standalone` (scheduler, triggerer, dag-processor, api-server: SIGTERM to
        its process group, as Ctrl-C in `make up` does) and start it again on the same database,
        dags folder and port, as an operator restarting the stack would; returns once it answers.
        Its log goes on in standalone.log."""
        up = load_up()
        assert self.airflow is not None
        up.stop(self.airflow)
        self.airflow = up.start_airflow(self.airflow_env, self.airflow_home / "standalone.log", append=True)
        up.wait_http(f"{self.url}/api/v2/monitor/health", self.airflow, "airflow standalone (restarted)", 240)
        self.sign_in()

    def get(self, path: str, **params) -> dict:
        response = self.session.get(f"{self.url}{path}", params=params, timeout=30)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text[:2000]}"
        return response.json()

    def dag(self, dag_id: str) -> dict | None:
        response = self.session.get(f"{self.url}/api/v2/dags/{dag_id}", timeout=30)
        if response.status_code == 404:
            return None
        assert response.status_code == 200, response.text[:2000]
        return response.json()

    def write_day(self, day: date) -> None:
        write_day(self.home, day)

    def mlflow_client(self, monkeypatch: pytest.MonkeyPatch):
        """An MlflowClient of this process on the stack's server (basic auth), restored after the test."""
        from mlflow import MlflowClient
        from mlflow.tracking._tracking_service import utils

        for name, value in self.mlflow.client_env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(utils, "_tracking_uri", self.mlflow.url)
        return MlflowClient()

    def wait_for(self, what: str, check, timeout: float, report=lambda: ""):
        deadline = time.monotonic() + timeout
        while (value := check()) is None or value is False:
            if time.monotonic() > deadline:
                log = (self.airflow_home / "standalone.log").read_text(errors="replace")[-4000:]
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what}\n{report()}\n--- standalone log tail ---\n{log}"
                )
            time.sleep(0.5)  # a wait ends within half a second of what it waits for
        return value

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float) -> str:
        """The run's final state ("success" or "failed"); a task report when it times out."""

        def finished():
            state = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
            return state if state in ("success", "failed") else None

        return self.wait_for(
            f"dag run {run_id}", finished, timeout, report=lambda: self.task_report(dag_id, run_id)
        )

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        tasks = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {t["task_id"]: t["state"] for t in tasks}

    def task_report(self, dag_id: str, run_id: str) -> str:
        """Each task's state, and the log tail of each that failed or is still going."""
        tasks = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        lines = [f"{t['task_id']}: {t['state']} (try {t['try_number']})" for t in tasks]
        for t in tasks:
            if t["state"] in ("failed", "up_for_retry", "deferred", "running") and t["try_number"]:
                response = self.session.get(
                    f"{self.url}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{t['task_id']}/logs/{t['try_number']}",
                    headers={"Accept": "application/json"},
                    timeout=30,
                )
                content = response.json().get("content", []) if response.ok else response.text
                text = (
                    "\n".join(e.get("event", str(e)) if isinstance(e, dict) else str(e) for e in content)
                    if isinstance(content, list)
                    else str(content)
                )
                lines.append(f"--- log of {t['task_id']} try {t['try_number']} ---\n{text[-4000:]}")
        return "\n".join(lines)


def write_day(home: Path, day: date) -> None:
    """One day of fraud_detector's data (`ds=<day>`) under TRAINPIPE_HOME `home`."""
    from airflow_trainpipe.examples.synthetic import write_day

    write_day((home / "data" / "card_transactions").as_uri(), day, ROWS_PER_DAY, seed=day.day)


@contextmanager
def running_stack(
    root: Path,
    *,
    scheduled_runs: bool = False,
    dag_files: dict[str, str] | None = None,
    database: str = "sqlite",
) -> Iterator[Stack]:
    """Airflow standalone (as `make up` starts it) + mlflow server + a moto S3 server (bucket
    BUCKET; the Airflow processes, and so the training jobs, get its AWS_* variables), state under `root`.

    dag_files: more files of the dags folder (path in it: text), there from the start.

    scheduled_runs: the scheduler also creates runs itself (cron and asset-triggered). Off for
    the shared stack, whose tests unpause the cron pipelines: each would otherwise also start
    today's scheduled run, which waits for a partition and holds the DAG's single active-run slot.

    database: Airflow's metadata database, "sqlite" (in its AIRFLOW_HOME) or "postgres" (as
    `make up DB=postgres`: up.py's cluster code, LocalExecutor and parallelism; the cluster in a
    temp folder, stopped after Airflow and removed, its log kept as `root`/postgres.log).
    """
    from tests.helpers.mlflow_server import start_mlflow_server, stop_mlflow_server
    from tests.helpers.moto_server import start_moto_server

    if database not in ("sqlite", "postgres"):
        raise ValueError(f"database: 'sqlite' or 'postgres', not {database!r}")
    up = load_up()
    dags, home, airflow_home = root / "dags", root / "home", root / "airflow"
    (dags / "configs").mkdir(parents=True)
    airflow_home.mkdir()
    shutil.copy(REPO_ROOT / "dags" / "trainpipe_pipelines.py", dags)
    for config in ("fraud_detector.yaml", "house_prices.yaml"):
        shutil.copy(REPO_ROOT / "dags" / "configs" / config, dags / "configs")
    fraud = (REPO_ROOT / "dags" / "configs" / "fraud_detector.yaml").read_text()
    (dags / "configs" / BROKEN_FILE).write_text(
        fraud.replace("pipeline: fraud_detector", "pipeline: fraud_broken").replace(
            "zero_stage: 1", "zero_stage: 7"
        )
    )
    (dags / "configs" / f"{APPROVAL_PIPELINE}.yaml").write_text(approval_config(fraud))
    for name, text in (dag_files or {}).items():
        (dags / name).write_text(text)
    for day in (date(2026, 1, 1), date(2026, 1, 2), PARTITION):
        write_day(home, day)
    # The simple auth manager keeps the passwords it generates in this file and reuses entries
    # that exist, so the tests know the admin password without scraping the log.
    (airflow_home / "simple_auth_manager_passwords.json.generated").write_text(
        json.dumps({"admin": ADMIN_PASSWORD})
    )

    # Both start at once: Airflow needs only the server's address and credentials, and on 2 cores
    # the two startups overlap (the server is waited for after Airflow answers).
    mlflow = start_mlflow_server(root / "mlflow", wait=False)
    smtp = SmtpServer().__enter__()
    airflow = s3 = stack = postgres = postgres_folder = None
    try:
        s3 = start_moto_server(root / "moto.log")
        port, metadata_db = free_port(), None
        if database == "postgres":
            # Not under `root`: as root the cluster runs as `postgres`, and pytest's tmp is 0700.
            postgres_folder = Path(tempfile.mkdtemp(prefix="trainpipe-up-pg-"))
            postgres, metadata_db = up.start_postgres(postgres_folder)
        env = up.airflow_env(
            airflow_home, dags, REPO_ROOT / "plugins", home, port, mlflow.connection_json(), metadata_db
        )
        env.update(s3.env())
        env["AIRFLOW_CONN_SMTP_DEFAULT"] = smtp.connection_json()
        env["TRAINPIPE_CONFIG_CACHE"] = str(root / "config-cache")
        env["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] = str(scheduled_runs)
        airflow = up.start_airflow(env, airflow_home / "standalone.log")
        url = f"http://127.0.0.1:{port}"
        try:
            up.wait_http(f"{url}/api/v2/monitor/health", airflow, "airflow standalone", 240)
        except RuntimeError as exc:
            raise RuntimeError(
                f"{exc}\n{(airflow_home / 'standalone.log').read_text(errors='replace')[-4000:]}"
            ) from None
        up.ensure_pools(env, dags / "configs")  # as `make up` does: train tasks wait for their pool
        mlflow.wait_healthy()
        s3.wait_ready((BUCKET,))
        stack = Stack(url, requests.Session(), dags / "configs", airflow_home, home, mlflow, smtp, s3)
        stack.airflow, stack.airflow_env = airflow, env
        stack.database, stack.postgres = database, postgres
        stack.database_url = metadata_db or f"sqlite:///{airflow_home / 'airflow.db'}"
        stack.sign_in()
        yield stack
    finally:
        if stack is not None:
            airflow = stack.airflow  # restart_airflow() replaced it
        try:
            if airflow is not None:
                up.stop(airflow)
            if s3 is not None:
                s3.stop()
            smtp.__exit__(None, None, None)
            stop_mlflow_server(mlflow.process)
        finally:
            try:
                if postgres is not None:  # last, as make up stops it: Airflow uses it until it exits
                    postgres.stop()
            finally:
                if postgres_folder is not None:
                    with contextlib.suppress(OSError):  # its log stays with the stack's others
                        shutil.copy(postgres_folder / "log", root / "postgres.log")
                    shutil.rmtree(postgres_folder, ignore_errors=True)


def approval_config(fraud: str) -> str:
    """fraud_detector.yaml registering into its own model, promoted only after a person approves,
    e-mailing the stack's SMTP server; its 1h deadline is long past for a run of 2026-01-03."""
    text = fraud.replace("pipeline: fraud_detector", f"pipeline: {APPROVAL_PIPELINE}").replace(
        "model_name: fraud_detector", f"model_name: {APPROVAL_PIPELINE}"
    )
    text = text.replace("  retry_delay: 2m\n", "  retry_delay: 2m\n  deadline: 1h\n")
    text = text.replace("\nregister:\n", "\nregister:\n  approval: required\n  approval_timeout: 1d\n")
    assert "approval: required" in text and "deadline: 1h" in text
    return text + "\nnotify:\n  email: [ml-oncall@example.com]\n  from_email: trainpipe@example.com\n"


@pytest.fixture(scope="package")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("e2e")) as stack:
        yield stack


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The shared stack's modules after the package's others, each group in file order; nothing
    outside this package moves. Only the order between the two groups changes: they share no
    state (the others run `dag.test()` or a stack of their own, on homes of their own)."""
    from tests.conftest import SHARED_FIXTURE_FILES, module_path

    on_stack = set(SHARED_FIXTURE_FILES["stack"])
    here = [i for i, item in enumerate(items) if item.nodeid.startswith("tests/integration/")]
    # sorted() is stable: False (not on the stack) first, each group keeping its order.
    ordered = sorted((items[i] for i in here), key=lambda item: module_path(item.nodeid) in on_stack)
    for index, item in zip(here, ordered, strict=True):
        items[index] = item


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failed browser test (one that set `item.browser_context`) keeps a screenshot and the HTML of
    every page it had open, in var/test-artifacts/<test>/, named in its failure report."""
    report = yield
    context = getattr(item, "browser_context", None)
    if context is None or not report.failed or report.when == "teardown":
        return report
    folder = ARTIFACTS / re.sub(r"[^\w.-]+", "_", item.name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for number, page in enumerate(context.pages):
        try:
            page.screenshot(path=str(folder / f"page{number}.png"), full_page=True)
            (folder / f"page{number}.html").write_text(f"<!-- {page.url} -->\n{page.content()}")
        except Exception as error:  # a crashed page must not hide the test's own failure
            (folder / f"page{number}.error.txt").write_text(repr(error))
    report.sections.append(("browser state", f"screenshots and HTML of the open pages: {folder}"))
    return report
