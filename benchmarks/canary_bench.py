"""Canary (issue 42): the local router's overhead per request, and the time a canary adds to a run.

Router overhead: two real `mlflow models serve` processes (one-row binary scorers logged from
code, tests/helpers/canary_models.py), then one-row requests from one client, alternately in
blocks of 50: straight to the candidate's server, and through the router with 100% of the traffic
on the candidate (the champion scoring every request in the shadow, off the client's path).
Medians and p99 of the client's own clock, side by side in one run.

Time a canary adds: the canary task group's own work, timed around the operators as the tasks
run them (registry in a SQLite store, real servers, real traffic): `canary.start` (both servers
up, the router started), one step of `step_duration` 10 s (from its execute to its trigger's
event, traffic flowing), and `canary.promote`. A pipeline's canary then costs start + steps x
(step_duration + the step's own overhead) + promote.

`python benchmarks/canary_bench.py` prints the section; `make bench ONLY=canary` writes it.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.helpers: the scorer models the tests serve
REQUESTS = 600
BLOCK = 50
STEP_S = 10


def _post(url: str, body: bytes) -> float:
    started = time.perf_counter()
    request = urllib.request.Request(
        f"{url}/invocations", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
    return (time.perf_counter() - started) * 1000


def _overhead(canary, candidate_url: str, router: str) -> list[str]:
    from tests.helpers.canary_models import request_body

    canary.set_percent(100.0)
    times: dict[str, list[float]] = {"direct": [], "router": []}
    for warm in range(20):
        _post(candidate_url, request_body(warm, 0.1))
        _post(router, request_body(warm, 0.1))
    for block in range(REQUESTS // BLOCK):
        for path, url in (("direct", candidate_url), ("router", router))[:: 1 if block % 2 else -1]:
            times[path] += [_post(url, request_body(i, (i % 13) / 4 - 1.5)) for i in range(BLOCK)]

    def p(values: list[float], q: float) -> float:
        return sorted(values)[int(q * len(values)) - 1]

    direct, routed = statistics.median(times["direct"]), statistics.median(times["router"])
    return [
        f"One-row requests, {REQUESTS // 2} each way (median / p99 of the client's clock): straight to the "
        f"candidate's `mlflow models serve` **{direct:.2f} / {p(times['direct'], 0.99):.2f} ms**, through the router "
        f"**{routed:.2f} / {p(times['router'], 0.99):.2f} ms**: the router adds **{routed - direct:.2f} ms** at the "
        f"median (ratio {routed / direct:.2f}), the champion's shadow scoring included on the same 2 cores.",
    ]


def _added_time(root: Path) -> list[str]:
    import mlflow
    from airflow.sdk.exceptions import TaskDeferred

    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.hooks.mlflow import MlflowHook
    from airflow_trainpipe.operators.canary import (
        CanaryPromoteOperator,
        CanaryStartOperator,
        CanaryStepOperator,
        _backend,
    )
    from tests.helpers.canary_models import log_scorer, request_body
    from tests.helpers.mlflow_backends import gate_decision, write_config
    from tests.helpers.triggers import first_event
    from tests.operators.conftest import TaskInstance

    os.environ["TRAINPIPE_HOME"] = str(root / "home")
    os.environ["AIRFLOW_CONN_MLFLOW_DEFAULT"] = json.dumps(
        {"conn_type": "mlflow", "extra": {"tracking_uri": f"sqlite:///{root / 'mlflow.db'}"}}
    )
    canary_yaml = (
        f"tags: {{team: risk-ml}}\ncanary:\n  steps: [100]\n  step_duration: {STEP_S}s\n  poll_interval: 1s"
    )
    config = load_config(
        write_config(root / "canary.yaml", "bench_canary", (("tags: {team: risk-ml}", canary_yaml),))
    )
    hook = MlflowHook()
    with hook.activated():
        versions = [
            str(mlflow.register_model(log_scorer(root, "good"), "bench_canary").version) for _ in range(2)
        ]
        client = hook.get_conn()
        client.set_registered_model_alias("bench_canary", "champion", versions[0])
        client.set_registered_model_alias("bench_canary", "canary", versions[1])
        staged = {
            "model_name": "bench_canary",
            "version": versions[1],
            "mlflow_run_id": None,
            "model_version_url": None,
        }
        xcoms = {
            ("register", "return_value"): staged,
            ("gate", "return_value"): gate_decision(champion_version=versions[0]).model_dump(mode="json"),
        }
        t0 = time.perf_counter()
        started = CanaryStartOperator(task_id="start", config=config).execute(
            {"ti": TaskInstance(xcoms=xcoms)}
        )
        start_s = time.perf_counter() - t0
        xcoms[("canary.start", "return_value")] = started
        lines = _overhead(
            _backend(config, versions[1]),
            _backend(config, versions[1]).deployment()["candidate"].url,
            started["router"],
        )
        stop = threading.Event()

        def traffic() -> None:
            i = 0
            while not stop.is_set():
                _post(started["router"], request_body(i, 0.3))
                i += 1
                time.sleep(0.01)

        sender = threading.Thread(target=traffic, daemon=True)
        sender.start()
        step = CanaryStepOperator(task_id="step_1", step=1, config=config)
        t0 = time.perf_counter()
        try:
            step.execute({"ti": TaskInstance(xcoms=xcoms)})
        except TaskDeferred as deferred:
            event = first_event(deferred.trigger, timeout=STEP_S * 3)
        assert event is not None and event["status"] == "held", event
        step.execute_complete({"ti": TaskInstance(xcoms=xcoms)}, event)
        step_s = time.perf_counter() - t0
        stop.set()
        sender.join()
        t0 = time.perf_counter()
        CanaryPromoteOperator(task_id="promote", config=config).execute({"ti": TaskInstance(xcoms=xcoms)})
        promote_s = time.perf_counter() - t0
        _backend(config, versions[1]).stop()
    return [
        *lines,
        "",
        f"Time the canary task group adds: `canary.start` **{start_s:.1f} s** (two `mlflow models serve` started side by "
        f"side, the router, the aliases), a step of {STEP_S} s **{step_s:.1f} s** from its execute to its verdict under "
        f"traffic ({event['figures']['requests']} requests judged), `canary.promote` **{promote_s:.1f} s**. A canary of "
        f"n steps adds about {start_s + promote_s:.0f} s + n x (step_duration + {step_s - STEP_S:.1f} s) to a run, "
        "scheduling between the tasks aside.",
    ]


def bench_canary() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        lines = _added_time(Path(tmp))
    return [
        "## Canary: the local router's overhead and the time a canary adds (issue 42)",
        "",
        *lines,
        "",
        "Command: `make bench ONLY=canary` (benchmarks/canary_bench.py).",
        "",
    ]


if __name__ == "__main__":
    print("\n".join(bench_canary()))
