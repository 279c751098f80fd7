from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from airflow_trainpipe.examples.synthetic import write_day

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_CONFIGS = REPO_ROOT / "dags" / "configs"
# The Feast interpreter (feature_store.client): the Makefile's .venv-feast unless the user set one.
os.environ.setdefault("TRAINPIPE_FEAST_PYTHON", str(REPO_ROOT / ".venv-feast" / "bin" / "python"))


# The session services a collected test needs start in the background before the first test (from
# `_isolated_airflow_home`, once the environment is set), while the first tests, mostly
# single-threaded, leave a core free; their fixtures then only wait for them. Each is a process
# apart: an `airflow db migrate`, an `mlflow server`, a PostgreSQL cluster, a Spark Connect JVM.
# They read os.environ as they start, in the first second of the session: a test that patches the
# environment then cannot reach them (none of the first tests patches what they read).
EARLY_SERVICES = ("migrated_airflow_db", "mlflow_server", "postgres_server", "spark_connect")
_early: dict[str, Future[Any]] = {}
_pools: list[ThreadPoolExecutor] = []


def early_service(name: str, start: Callable[[], Any]) -> Any:
    """The service `name`, started early by `_start_early_services` or now by `start`."""
    future = _early.pop(name, None)
    return future.result() if future is not None else start()


@pytest.fixture(autouse=True, scope="session")
def _isolated_airflow_home(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[None]:
    # Keep Airflow's state (airflow.cfg, SQLite DB, logs) out of the user's ~/airflow.
    home = tmp_path_factory.mktemp("airflow_home")
    os.environ.setdefault("AIRFLOW_HOME", str(home))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    # DeepSpeed JIT-compiles its CPU comm op on first use (~40 s), into a folder per interpreter
    # layout (runtime/extensions.py); keep the suite's builds with the venv, out of the user's
    # ~/.cache/torch_extensions.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    # As in an activated virtualenv. The build runs the first `ninja` on PATH, part of the build
    # layout: jobs started with and without the venv's bin first (pods, the local launcher)
    # would each build the op once, in folders of their own.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # Every training job the suite starts keeps a GPU node's rule for its collectives: a host
    # tensor on the default group (nccl there) fails here too (runtime/collectives.py).
    os.environ.setdefault("TRAINPIPE_CHECK_COLLECTIVES", "nccl")
    # After the environment above: the services inherit it.
    _start_early_services(request.session, tmp_path_factory)
    yield
    _stop_unused_early_services()


@pytest.fixture(autouse=True)
def _mlflow_experiment_forgotten() -> Iterator[None]:
    # mlflow.set_experiment keeps the experiment's id in a module global and exports it as
    # MLFLOW_EXPERIMENT_ID: the next test's start_run, on a store of its own, then looks for an
    # experiment that store never had ("No Experiment with id=1 exists"). No test sets either on
    # purpose, so both are dropped after every test (a module fixture may have set them before it).
    yield
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is not None:
        fluent._active_experiment_id = None  # type: ignore[attr-defined]
    for key in ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        os.environ.pop(key, None)


@pytest.fixture(scope="session")
def trainpipe_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("trainpipe_home")
    os.environ["TRAINPIPE_HOME"] = str(home)  # inherited by every job: one MLflow database
    return home


@pytest.fixture(scope="session")
def job_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_day(tmp_path_factory.mktemp("data").as_uri(), date(2026, 1, 1), 1200, seed=5)


def _migrate_airflow_db(home: Path) -> Path:
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    airflow = Path(sys.executable).parent / "airflow"
    subprocess.run([str(airflow), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return home / "airflow.db"


@pytest.fixture(scope="session")
def migrated_airflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Airflow metadata DB (SQLite) after `airflow db migrate`, migrated once per session:
    every `dag.test()` home starts from a copy (see `tests.helpers.airflow_dags.dag_test_env`)."""
    return early_service(
        "migrated_airflow_db", lambda: _migrate_airflow_db(tmp_path_factory.mktemp("airflow_migrated"))
    )


@pytest.fixture(scope="session")
def migrated_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An embedded MLflow store (SQLite) after MLflow's migrations, once per session: a test's own
    store can start from a copy (`fresh_mlflow_store`). The migrations take ~1.4 s a store, and
    the suite made 55 of them; the first client of a copy finds the schema current."""
    from mlflow.tracking import MlflowClient

    store = tmp_path_factory.mktemp("mlflow_migrated") / "mlflow.db"
    MlflowClient(f"sqlite:///{store}").search_experiments()  # creates and migrates the store
    return store


def fresh_mlflow_store(folder: Path, migrated: Path) -> str:
    """A new embedded store in `folder` (its `mlflow.db`, as TRAINPIPE_HOME's), copied from the
    migrated one; returns its tracking URI. `folder` must not hold a store yet."""
    folder.mkdir(parents=True, exist_ok=True)
    store = folder / "mlflow.db"
    with open(migrated, "rb") as source, open(store, "xb") as copy:
        shutil.copyfileobj(source, copy)
    return f"sqlite:///{store}"


@pytest.fixture(scope="session")
def airflow_env(
    tmp_path_factory: pytest.TempPathFactory, migrated_airflow_db: Path, migrated_mlflow_db: Path
) -> dict[str, str]:
    """Environment of a migrated Airflow (SQLite) with its own dags folder, for `dag.test()` runs."""
    from tests.helpers.airflow_dags import dag_test_env

    return dag_test_env(
        tmp_path_factory.mktemp("airflow_dag_tests"), migrated_airflow_db, migrated_mlflow=migrated_mlflow_db
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with bucket `trainpipe`; AWS_* variables point at it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    saved = {
        k: os.environ.get(k)
        for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    # Inherited by training processes; botocore (and so s3fs) reads AWS_ENDPOINT_URL.
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="trainpipe")
    yield endpoint
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """A real `mlflow server` (basic auth, sqlite, local artifacts) on 127.0.0.1 for the session."""
    from tests.helpers.mlflow_server import start_mlflow_server, stop_mlflow_server

    server = early_service(
        "mlflow_server", lambda: start_mlflow_server(tmp_path_factory.mktemp("mlflow_server"))
    )
    yield server
    stop_mlflow_server(server.process)


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL cluster (Debian's postgresql) on 127.0.0.1 for the session."""
    from tests.helpers.postgres import PostgresServer

    server = early_service("postgres_server", lambda: PostgresServer(free_port()).__enter__())
    try:
        yield server
    finally:
        server.__exit__(None, None, None)


@pytest.fixture(scope="session")
def spark_connect():
    """A real Spark Connect server (pyspark's spark-submit, a JVM apart) on 127.0.0.1 for the
    session; its start time is printed (and recorded as `start_seconds`)."""
    from tests.helpers.spark_connect import SparkConnectServer

    server = early_service("spark_connect", lambda: SparkConnectServer(free_port()).__enter__())
    try:
        print(f"\nSpark Connect server {server.url} ready in {server.start_seconds:.1f} s")
        yield server
    finally:
        server.__exit__(None, None, None)


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kubeconfig whose API server has nothing listening (there is no cluster here)."""
    from tests.helpers.kubernetes import unreachable_kubeconfig

    return unreachable_kubeconfig(tmp_path, monkeypatch)


@pytest.fixture
def smtp_server(monkeypatch: pytest.MonkeyPatch):
    """A real SMTP server (aiosmtpd) on 127.0.0.1 for one test; Airflow connection `smtp_test`."""
    from tests.helpers.smtp_server import SmtpServer

    with SmtpServer() as server:
        monkeypatch.setenv("AIRFLOW_CONN_SMTP_TEST", server.connection_json())
        yield server


# With pytest-xdist (`make test TEST_WORKERS=N`) tests are scheduled by file, so a file's module
# fixtures (trained jobs, built images) are made once and its tests keep their order. The files
# sharing one of these expensive session or package fixtures go to one worker together, in file
# order: each worker would otherwise start its own (a whole Airflow standalone stack, a Spark
# Connect JVM). A test using one of them from a file not listed here stops the collection.
SHARED_FIXTURE_FILES = {
    "stack": (
        "tests/integration/test_soak.py",
        "tests/integration/test_standalone.py",
        "tests/integration/test_standalone_approval.py",
        "tests/integration/test_standalone_canary.py",
        "tests/integration/test_standalone_pools.py",
        "tests/integration/test_ui_browser.py",
    ),
    "spark_connect": ("tests/operators/test_validate_spark.py", "tests/data/validation/test_spark_engine.py"),
}


def module_path(nodeid: str) -> str:
    """The test file of a test id (`tests/x/test_y.py::test_z` -> `tests/x/test_y.py`)."""
    return nodeid.split("::", 1)[0]


def xdist_scope(nodeid: str) -> str:
    """The unit a worker runs whole: the shared fixture a file needs, or else the file."""
    path = module_path(nodeid)
    return next((fixture for fixture, files in SHARED_FIXTURE_FILES.items() if path in files), path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    # Not xdist's --dist loadgroup: it tags test ids with the group, and pytest 9.2's Node.nodeid
    # no longer reads the attribute xdist 3.8 writes, so every test was scheduled on its own.
    if config.getvalue("dist") not in ("load", "loadfile", "loadscope", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return SharedFixtureScheduling(config, log)  # type: ignore[arg-type]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = module_path(item.nodeid)
        for fixture, files in SHARED_FIXTURE_FILES.items():
            if fixture in getattr(item, "fixturenames", ()) and path not in files:
                raise pytest.UsageError(
                    f"{item.nodeid} uses the {fixture} fixture: add {path} to SHARED_FIXTURE_FILES in "
                    "tests/conftest.py, so that pytest-xdist runs it on the worker that started it"
                )


def _start_early_services(session: pytest.Session, factory: pytest.TempPathFactory) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a worker runs a share of the items: it starts what its own tests ask for
    needed = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    starts: dict[str, Callable[[], Any]] = {
        "migrated_airflow_db": lambda: _migrate_airflow_db(factory.mktemp("airflow_migrated")),
        "mlflow_server": lambda: _start_mlflow(factory),
        "postgres_server": _start_postgres,
        "spark_connect": _start_spark,
    }
    wanted = [name for name in EARLY_SERVICES if name in needed]
    if wanted:
        # The pool's threads live until the session ends: the Spark server dies with the thread
        # that started it (PR_SET_PDEATHSIG is per thread), so its starter must not exit first.
        pool = ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="early-service")
        _pools.append(pool)
        for name in wanted:
            _early[name] = pool.submit(starts[name])


def _stop_unused_early_services() -> None:
    """A service started early that no test asked for in the end (-x stopped the run first)."""
    from tests.helpers.mlflow_server import stop_mlflow_server

    for name, future in list(_early.items()):
        _early.pop(name)
        try:
            service = future.result()
        except Exception:  # it failed to start: nothing to stop
            continue
        if name == "mlflow_server":
            stop_mlflow_server(service.process)
        elif name in ("postgres_server", "spark_connect"):
            service.__exit__(None, None, None)
    for pool in _pools:
        pool.shutdown(wait=True)


def _start_mlflow(factory: pytest.TempPathFactory) -> Any:
    from tests.helpers.mlflow_server import start_mlflow_server

    return start_mlflow_server(factory.mktemp("mlflow_server"))


def _start_postgres() -> Any:
    from tests.helpers.postgres import PostgresServer

    return PostgresServer(free_port()).__enter__()


def _start_spark() -> Any:
    from tests.helpers.spark_connect import SparkConnectServer

    return SparkConnectServer(free_port()).__enter__()
