"""`make up`: Airflow standalone (api-server, scheduler, dag-processor, triggerer on SQLite) with
this repo's dags/ and plugins/, plus an `mlflow server`, both on 127.0.0.1. Ctrl-C, SIGTERM or
SIGHUP (a closed terminal, `kill`, a supervisor) stops every process group it started, and the
model servers of the canaries that Airflow started (they outlive tasks, not `make up`).

`--db postgres` (`make up DB=postgres`): Airflow's metadata database in a PostgreSQL cluster of
its own (Debian's `postgresql`, tests/helpers/postgres.py, the tests' code), data in
var/up/postgres/ kept between runs, started on a free 127.0.0.1 port and stopped last; Airflow
on it with the LocalExecutor and a parallelism sized to the host's cores (`postgres_env`).

State lives in var/up/ (gitignored): airflow/ (AIRFLOW_HOME), home/ (TRAINPIPE_HOME with
synthetic data for fraud_detector, home/warehouse.db, the SQLite table fraud_detector_sql reads
through the connection trainpipe_warehouse, home/lake, the Iceberg catalog fraud_detector_iceberg
reads through the connection trainpipe_lake, home/lake_delta, fraud_detector_delta's Delta table, and home/feast, fraud_detector_features's
transactions and Feast repo), mlflow/ (tracking db and artifacts), postgres/ (with --db postgres). A third child replays today's
rows to fraud_detector_canary's canary whenever one serves (`trainpipe canary-replay`, log in
home/canary-replay.log). tests/integration reuses
`airflow_env`, `start_airflow` and `start_postgres` so the test starts Airflow exactly the way
`make up` does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WAREHOUSE = "warehouse.db"  # under TRAINPIPE_HOME: dags/configs/fraud_detector_sql.yaml's table
LAKE = "lake"  # under TRAINPIPE_HOME: the catalog of dags/configs/fraud_detector_iceberg.yaml's table
DELTA_TABLE = "lake_delta/card_transactions"  # under TRAINPIPE_HOME: fraud_detector_delta.yaml's table
FEAST_EXAMPLE = "feast"  # under TRAINPIPE_HOME: fraud_detector_features.yaml's transactions and Feast repo
CANARY_EXAMPLE = REPO / "dags" / "configs" / "fraud_detector_canary.yaml"

if TYPE_CHECKING:
    from tests.helpers.postgres import PostgresCluster


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def pick_port(preferred: int) -> int:
    if port_free(preferred):
        return preferred
    port = free_port()
    print(f"port {preferred} is taken; using {port}", flush=True)
    return port


def airflow_env(
    airflow_home: Path,
    dags: Path,
    plugins: Path,
    trainpipe_home: Path,
    port: int,
    mlflow_connection: str,
    metadata_db: str | None = None,
) -> dict[str, str]:
    """The environment of `airflow standalone`: loopback, short parse intervals, mlflow_default,
    trainpipe_warehouse (the SQLite file of the sql source example, `sqlite://` + its path) and
    trainpipe_lake (the Iceberg SQL catalog of the iceberg source example). `metadata_db`: a
    PostgreSQL SQLAlchemy URL (`postgres_url`) for the metadata database, with `postgres_env`'s
    settings; None keeps Airflow's default, SQLite in AIRFLOW_HOME."""
    from airflow_trainpipe.examples.iceberg_table import connection

    env = {**os.environ}
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(name, None)
    env.update(
        {
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            # A YAML edit is seen on the loader file's next parse; a new Python file on the next scan.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            # A removed YAML's DAG goes stale at the next cleanup after the loader's next parse.
            "AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD": "10",
            "AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL": "10",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW_CONN_MLFLOW_DEFAULT": mlflow_connection,
            "AIRFLOW_CONN_TRAINPIPE_WAREHOUSE": "sqlite://" + quote(str(trainpipe_home / WAREHOUSE), safe=""),
            "AIRFLOW_CONN_TRAINPIPE_LAKE": connection(trainpipe_home / LAKE),
            "TRAINPIPE_HOME": str(trainpipe_home),
            # The training pool `ensure_pools` sizes to the cores: each rank's share when it is full.
            "TRAINPIPE_HOST_RANKS": str(len(os.sched_getaffinity(0))),
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",  # torchrun, trainpipe of this venv
        }
    )
    env.update(openlineage_env(env, trainpipe_home))
    if metadata_db is not None:
        env.update(postgres_env(metadata_db))
    return env


POSTGRES_FOLDER = "postgres"  # under the state folder: make up's cluster, kept between runs
AIRFLOW_DATABASE = "airflow"  # the database of that cluster Airflow's metadata lives in


def start_postgres(folder: Path) -> tuple[PostgresCluster, str]:
    """The PostgreSQL cluster in `folder` (initdb the first time, its data kept) started on a free
    127.0.0.1 port, with the database `airflow`: the cluster (call its `stop()`) and the
    SQLAlchemy URL of that database. The cluster code is the tests' own
    (tests/helpers/postgres.py), imported from the repo root, only when asked for: one way to
    start a Debian PostgreSQL cluster, and the SQLite `make up` needs nothing of tests/."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.helpers.postgres import PostgresCluster

    cluster = PostgresCluster(folder, free_port())
    cluster.start()
    try:
        return cluster, postgres_url(cluster.ensure_database(AIRFLOW_DATABASE))
    except BaseException:
        cluster.stop()  # the caller never got hold of it
        raise


def postgres_url(connection_uri: str) -> str:
    """SQLAlchemy's URL of a postgres:// database for the installed driver, psycopg 3 (psycopg2,
    Airflow's usual one, is not installed; asyncpg neither)."""
    return connection_uri.replace("postgres://", "postgresql+psycopg://", 1)


def parallelism(cores: int) -> int:
    """Task instances the LocalExecutor runs at once. Every running task is a worker process (the
    executor forks them all when the scheduler starts), so not Airflow's 32 on a 2-core host.
    Training: the trainpipe_training pool has a slot per core (`trainpipe pools`) and each local
    train task takes one per rank, so at most `cores` train tasks run (deferrable sensors and
    canary steps wait in the triggerer, outside any slot). Light tasks (validate_data, gate,
    register, tuning's bookkeeping) mostly wait on I/O or MLflow: two per core, at least 4, so
    that full training slots leave room for them. 2 cores: 6; 16 cores: 48. Train tasks of pods
    hold a slot each while they watch theirs: with many, set AIRFLOW__CORE__PARALLELISM."""
    return cores + max(4, 2 * cores)


def postgres_env(url: str) -> dict[str, str]:
    """Airflow on PostgreSQL: the metadata database, the LocalExecutor and its parallelism.
    `airflow standalone` takes them as they are: it forces the LocalExecutor only when the
    configured executor is not a local one, and migrates whatever database sql_alchemy_conn names.
    [core] max_active_tasks_per_dag stays at its default (16): a pipeline's run is a chain of
    single tasks, its trials take the training pool's slots, so parallelism and the pools bind
    first; default_pool (128 slots) likewise."""
    return {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
        # Airflow derives postgresql+asyncpg:// for its async engine; psycopg 3 is async as well.
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": url,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # A parallelism of the user's environment wins.
        "AIRFLOW__CORE__PARALLELISM": os.environ.get("AIRFLOW__CORE__PARALLELISM")
        or str(parallelism(len(os.sched_getaffinity(0)))),
    }


def metadata_description(env: dict[str, str]) -> str:
    """The banner's line: which metadata database Airflow runs on, and its executor."""
    url = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") or f"sqlite:///{env['AIRFLOW_HOME']}/airflow.db"
    kind = "PostgreSQL" if url.startswith("postgresql") else "SQLite" if url.startswith("sqlite") else ""
    # Airflow 3.3's defaults, on SQLite too: the LocalExecutor, parallelism 32.
    executor = env.get("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    return f"{kind} {url}   ({executor}, parallelism {env.get('AIRFLOW__CORE__PARALLELISM', '32')})".lstrip()


OPENLINEAGE_SETTINGS = (
    "AIRFLOW__OPENLINEAGE__TRANSPORT",
    "AIRFLOW__OPENLINEAGE__CONFIG_PATH",
    "OPENLINEAGE_URL",
    "OPENLINEAGE_CONFIG",
)


def openlineage_env(env: dict[str, str], trainpipe_home: Path) -> dict[str, str]:
    """With the OpenLineage provider installed (the `[openlineage]` extra) and no transport of the
    user's: every task's events appended to TRAINPIPE_HOME/openlineage/events.jsonl (docs/lineage.md)."""
    import importlib.util

    if importlib.util.find_spec("airflow.providers.openlineage") is None or any(
        k in env for k in OPENLINEAGE_SETTINGS
    ):
        return {}
    events = trainpipe_home / "openlineage" / "events.jsonl"
    events.parent.mkdir(parents=True, exist_ok=True)
    return {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": env.get("AIRFLOW__OPENLINEAGE__NAMESPACE", "trainpipe"),
    }


def start_airflow(
    env: dict[str, str], log_path: Path | None = None, append: bool = False
) -> subprocess.Popen[bytes]:
    """`airflow standalone` in its own process group (Ctrl-C in the terminal reaches only us)."""
    mode = "ab" if append else "wb"
    output = open(log_path, mode) if log_path else None  # noqa: SIM115 - kept open for the process's lifetime
    return subprocess.Popen(
        [str(BIN / "airflow"), "standalone"],
        env=env,
        start_new_session=True,
        stdout=output,
        stderr=subprocess.STDOUT if output else None,
    )


def wait_http(url: str, process: subprocess.Popen[bytes], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer {url} within {timeout:.0f}s")
        time.sleep(1)


def stop(process: subprocess.Popen[bytes], grace: float = 30) -> None:
    """SIGTERM the whole process group, SIGKILL what is left after `grace` seconds."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # stragglers of the group, even after the leader exited
        process.wait()


def ensure_data(trainpipe_home: Path, days: int = 4) -> None:
    """Synthetic partitions up to today, so the latest scheduled or manual run finds its data."""
    out = trainpipe_home / "data" / "card_transactions"
    start = date.today() - timedelta(days=days - 1)
    if all((out / f"ds={start + timedelta(days=i)}" / "_SUCCESS").exists() for i in range(days)):
        return
    print(f"writing {days} days of synthetic card transactions to {out}", flush=True)
    subprocess.run(
        [
            str(BIN / "trainpipe"),
            "make-data",
            "--out",
            str(out),
            "--start",
            start.isoformat(),
            "--days",
            str(days),
        ],
        check=True,
    )


def _last_days(days: int) -> list[date]:
    start = date.today() - timedelta(days=days - 1)
    return [start + timedelta(days=i) for i in range(days)]


def _make_table_data(option: str, target: Path, wanted: list[date], rows: int, what: str) -> None:
    """`trainpipe make-data --<option> target` for the days `wanted` (consecutive)."""
    print(f"writing {len(wanted)} days of synthetic card transactions into {what} {target}", flush=True)
    days = ["--start", wanted[0].isoformat(), "--days", str(len(wanted)), "--rows", str(rows)]
    subprocess.run(
        [str(BIN / "trainpipe"), "make-data", f"--{option}", str(target), *days],
        check=True,
        stdout=subprocess.DEVNULL,  # a connection it prints is already in Airflow's environment
    )


def ensure_warehouse(trainpipe_home: Path, days: int = 7, rows: int = 5_000) -> None:
    """The days up to today in the SQLite table of the sql source example (a 7-day window)."""
    path, wanted = trainpipe_home / WAREHOUSE, _last_days(days)
    held: set[str] = set()
    if path.exists():
        with contextlib.closing(sqlite3.connect(path)) as db:
            try:
                held = {day for (day,) in db.execute("SELECT DISTINCT event_date FROM card_transactions")}
            except sqlite3.Error:
                held = set()
    if not {d.isoformat() for d in wanted} <= held:
        _make_table_data("sqlite", path, wanted, rows, "the SQLite database")


def ensure_lake(trainpipe_home: Path, days: int = 7, rows: int = 5_000) -> None:
    """The days up to today in the Iceberg table of the iceberg source example (a 7-day window)."""
    from airflow_trainpipe.examples.iceberg_table import days_held

    folder, wanted = trainpipe_home / LAKE, _last_days(days)
    if not set(wanted) <= days_held(folder):
        _make_table_data("iceberg", folder, wanted, rows, "the Iceberg catalog")


def ensure_delta(trainpipe_home: Path, days: int = 7, rows: int = 5_000) -> None:
    """The days up to today in the Delta table of the delta source example (a 7-day window)."""
    from airflow_trainpipe.examples.delta_table import days_held

    table, wanted = trainpipe_home / DELTA_TABLE, _last_days(days)
    if not set(wanted) <= days_held(table):
        _make_table_data("delta", table, wanted, rows, "the Delta table")


def ensure_feast(trainpipe_home: Path, days: int = 7, rows: int = 5_000) -> None:
    """The days up to today of the feature store example: its transactions, the card and merchant
    feature tables and the applied Feast repo (a 7-day window)."""
    root, wanted = trainpipe_home / FEAST_EXAMPLE, _last_days(days)
    held = all((root / "transactions" / f"ds={day}" / "_SUCCESS").exists() for day in wanted)
    if not (held and (root / "repo" / "feature_store.yaml").exists()):
        _make_table_data("feast", root, wanted, rows, "the Feast example")


def ensure_pools(env: dict[str, str], configs: Path) -> None:
    """`trainpipe pools --apply`: the training pools the configs' train tasks take slots of, sized
    to this host's cores (a train task waits, `scheduled`, for a pool that does not exist). Run
    once Airflow answers: `airflow standalone` migrates the metadata database first."""
    done = subprocess.run(
        [str(BIN / "trainpipe"), "pools", str(configs), "--apply"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"trainpipe pools --apply failed:\n{done.stdout}{done.stderr[-3000:]}")
    print(done.stdout.strip(), flush=True)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stop(Exception):
    """A stop signal arrived: leave the main loop, the `finally` stops the children."""


_deferred: list[int] | None = None  # signals held back while a child is being started


def _on_signal(signum: int, _frame: object) -> None:
    if _deferred is not None:
        _deferred.append(signum)
        return
    raise Stop(signal.Signals(signum).name)


@contextmanager
def _starting() -> Iterator[None]:
    """Hold stop signals back while a child starts: raised inside Popen after the fork, the child
    would run on with nobody holding its Popen to stop it. Raised as soon as it is assigned."""
    global _deferred
    _deferred = []
    try:
        yield
    finally:
        pending, _deferred = _deferred, None
        if pending:
            raise Stop(signal.Signals(pending[0]).name)


def start_canary_replay(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """The callers of the canary example: without requests its steps would fail for lack of evidence."""
    return subprocess.Popen(
        [str(BIN / "trainpipe"), "canary-replay", str(CANARY_EXAMPLE), "--ds", date.today().isoformat()],
        env=env,
        start_new_session=True,
        stdout=open(log_path, "wb"),
        stderr=subprocess.STDOUT,
    )


def start_mlflow(root: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            str(BIN / "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
        ],
        start_new_session=True,
        stdout=open(root / "server.log", "wb"),
        stderr=subprocess.STDOUT,
    )


def banner(env: dict[str, str], airflow_port: int, mlflow_url: str, state: Path) -> str:
    """What `make up` prints once everything answers: addresses, login, the examples' data."""
    airflow_home, trainpipe_home = Path(env["AIRFLOW_HOME"]), Path(env["TRAINPIPE_HOME"])
    passwords = airflow_home / "simple_auth_manager_passwords.json.generated"
    password = json.loads(passwords.read_text()).get("admin", "?") if passwords.exists() else "?"
    lines = [
        f"Airflow  http://127.0.0.1:{airflow_port}   login admin / {password}   (from {passwords})",
        f"metadata {metadata_description(env)}",
        f"MLflow   {mlflow_url}   (also under Browse > MLflow in Airflow)",
        f"dags     {REPO / 'dags'}   state {state}",
        f"sql      fraud_detector_sql reads {trainpipe_home / WAREHOUSE} (connection trainpipe_warehouse)",
        f"iceberg  fraud_detector_iceberg reads the catalog {trainpipe_home / LAKE} (connection trainpipe_lake)",
        f"delta    fraud_detector_delta reads the table {trainpipe_home / DELTA_TABLE}",
        f"feast    fraud_detector_features joins the Feast repo {trainpipe_home / FEAST_EXAMPLE / 'repo'}",
        "canary   fraud_detector_canary's router http://127.0.0.1:5055 gets today's rows while it"
        f" serves (log {trainpipe_home / 'canary-replay.log'})",
        "Ctrl-C (or SIGTERM, SIGHUP) stops everything.",
    ]
    return "\n" + "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, default=REPO / "var" / "up")
    parser.add_argument("--airflow-port", type=int, default=8080)
    parser.add_argument("--mlflow-port", type=int, default=5000)
    parser.add_argument(
        "--db",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="Airflow's metadata database: SQLite in AIRFLOW_HOME (default) or a PostgreSQL cluster "
        f"of make up's own in <state>/{POSTGRES_FOLDER}",
    )
    args = parser.parse_args()
    state = args.state.resolve()
    airflow_home, trainpipe_home, mlflow_root = state / "airflow", state / "home", state / "mlflow"
    for folder in (airflow_home, trainpipe_home, mlflow_root):
        folder.mkdir(parents=True, exist_ok=True)
    for signum in STOP_SIGNALS:  # Ctrl-C included: one path, and SIGINT is held back too while a child starts
        signal.signal(signum, _on_signal)
    mlflow = airflow = replay = postgres = None
    try:
        ensure_data(trainpipe_home)
        ensure_warehouse(trainpipe_home)
        ensure_lake(trainpipe_home)
        ensure_delta(trainpipe_home)
        ensure_feast(trainpipe_home)
        airflow_port, mlflow_port = pick_port(args.airflow_port), pick_port(args.mlflow_port)
        if airflow_port == mlflow_port:
            mlflow_port = free_port()
        mlflow_url = f"http://127.0.0.1:{mlflow_port}"
        with _starting():
            mlflow = start_mlflow(mlflow_root, mlflow_port)
        metadata_db = None
        if args.db == "postgres":  # while the MLflow server starts; initdb ~2 s the first time
            with _starting():  # pg_ctl cut short could leave a postmaster nobody stops
                postgres, metadata_db = start_postgres(state / POSTGRES_FOLDER)
        connection = json.dumps({"conn_type": "mlflow", "host": "http://127.0.0.1", "port": mlflow_port})
        dags, plugins = REPO / "dags", REPO / "plugins"
        env = airflow_env(airflow_home, dags, plugins, trainpipe_home, airflow_port, connection, metadata_db)
        with _starting():
            airflow = start_airflow(
                env, airflow_home / "standalone.log"
            )  # the terminal keeps only what a user needs
        print(
            f"starting mlflow server and airflow standalone (logs: {mlflow_root / 'server.log'}, {airflow_home / 'standalone.log'}) ...",
            flush=True,
        )
        wait_http(f"{mlflow_url}/health", mlflow, "mlflow server", 120)
        wait_http(
            f"http://127.0.0.1:{airflow_port}/api/v2/monitor/health", airflow, "airflow standalone", 300
        )
        ensure_pools(env, REPO / "dags" / "configs")
        with _starting():
            replay = start_canary_replay(env, trainpipe_home / "canary-replay.log")
        print(banner(env, airflow_port, mlflow_url, state), flush=True)
        while airflow.poll() is None and mlflow.poll() is None:
            time.sleep(1)
        print(
            f"a process exited (airflow: {airflow.returncode}, mlflow: {mlflow.returncode}); stopping",
            flush=True,
        )
        return 1
    except Stop as request:
        also = " and postgresql" if args.db == "postgres" else ""
        print(f"\n{request}: stopping airflow and mlflow{also} ...", flush=True)
        return 0
    finally:
        for signum in STOP_SIGNALS:  # a second Ctrl-C or kill must not leave orphans
            signal.signal(signum, signal.SIG_IGN)
        try:
            for process in (replay, airflow, mlflow):
                if process is not None:
                    stop(process)
            stop_canaries(trainpipe_home)
        finally:
            if postgres is not None:  # last: Airflow's processes use it until they exit
                postgres.stop()


def stop_canaries(trainpipe_home: Path) -> None:
    """Every local canary's router and model servers (each in a session of its own)."""
    from airflow_trainpipe.canary.local import LocalCanary
    from airflow_trainpipe.config.canary import LocalServing

    for deployment in (trainpipe_home / "canary").glob("*/v*/deployment.json"):
        LocalCanary(deployment.parent, LocalServing()).stop()


if __name__ == "__main__":
    sys.exit(main())
