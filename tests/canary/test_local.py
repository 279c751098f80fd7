"""The local backend with real `mlflow models serve` processes, the real router and real traffic."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_trainpipe.canary.checks import Thresholds, judge, read_step
from airflow_trainpipe.canary.local import _STARTED, LocalCanary, ServingError, _alive
from airflow_trainpipe.config.canary import CanaryChecks, LatencyCheck, LocalServing
from tests.helpers.canary_models import log_scorer, request_body

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], dict[str, str]]:
    """Three real models in one tracking store, and the environment that reaches it."""
    import mlflow

    root = tmp_path_factory.mktemp("canary-models")
    uri = f"sqlite:///{root}/mlflow.db"
    # Logging exports MLFLOW_TRACKING_URI (set_tracking_uri, and log_model itself): every later
    # job and dag.test() of the session would inherit it and register into this store. Undone here.
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        mlflow.set_tracking_uri(uri)
        uris = {mode: log_scorer(root, mode) for mode in ("good", "flip", "flaky")}
    finally:
        mlflow.set_tracking_uri(None)
        if saved is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved
    return uris, {"MLFLOW_TRACKING_URI": uri}


@pytest.fixture
def canary(tmp_path: Path, models: tuple[dict[str, str], dict[str, str]]) -> Iterator[LocalCanary]:
    backend = LocalCanary(tmp_path / "canary", LocalServing(), env=models[1])
    yield backend
    backend.stop()


def _send(router: str, count: int, start: int = 1) -> list[int]:
    statuses = []
    for row in range(start, start + count):
        request = urllib.request.Request(
            f"{router}/invocations", data=request_body(row, (row % 13) / 4 - 1.5),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                statuses.append(response.status)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)
    return statuses


def _settled(canary: LocalCanary, count: int) -> None:
    """The shadow scorings land a moment after the answers."""
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if len(canary.requests_log.read_text().splitlines()) >= count:
            return
        time.sleep(0.1)


def _step(canary: LocalCanary, models, candidate: str, percent: float, requests: int):
    """The `good` champion beside `candidate` at `percent`, then `requests` one-row requests through
    the router: (the router's URL, what the clients got, the step's figures)."""
    router = canary.start(models[0]["good"], models[0][candidate])
    canary.set_percent(percent)
    statuses = _send(router, requests)
    _settled(canary, requests)
    return router, statuses, read_step(canary.requests_log, 0, None, Thresholds())


def test_a_good_candidate_takes_its_share_then_all_traffic(canary: LocalCanary, models) -> None:
    router, statuses, figures = _step(canary, models, "good", 10.0, 200)
    assert statuses == [200] * 200
    assert figures.requests == 200  # answered or shadow-scored: every request judges the candidate
    assert 5 <= figures.served <= 40  # about 10% answered by it
    assert (figures.errors, figures.disagreement, figures.compared_rows) == (0, 0.0, 200)
    # 200 clean requests decide these at 95% (holding the defaults, 0.01 and a p99, takes ~380).
    checks = CanaryChecks(max_error_rate=0.05, latency=LatencyCheck(percentile=95, max_ms=500))
    assert judge(figures, checks, ended=True).holds is True
    champion = canary.deployment()["champion"].pid
    canary.promote()
    assert not _alive(champion)
    assert _send(router, 20, start=1000) == [200] * 20
    status = json.loads(urllib.request.urlopen(f"{router}/canary/status").read())
    assert status["percent"] == 100.0


def test_a_candidate_that_errors_on_a_share_fails_the_first_step_and_is_rolled_back(
    canary: LocalCanary, models
) -> None:
    router, statuses, figures = _step(canary, models, "flaky", 5.0, 100)
    verdict = judge(figures, CanaryChecks(), ended=False)
    assert verdict.holds is False and verdict.failed[0].startswith("error_rate 0.2 [")
    assert statuses.count(200) >= 90  # the clients mostly saw the champion
    candidate = canary.deployment()["candidate"].pid
    canary.rollback()
    assert not _alive(candidate)
    assert _send(router, 50, start=5) == [200] * 50  # row 5, 10, ...: all on the champion now


def test_a_candidate_that_answers_differently_fails_on_disagreement(canary: LocalCanary, models) -> None:
    _, statuses, figures = _step(canary, models, "flip", 5.0, 60)
    assert statuses == [200] * 60
    verdict = judge(figures, CanaryChecks(), ended=False)
    assert verdict.holds is False and verdict.failed[0].startswith("disagreement"), figures
    assert figures.disagreement > 0.9 and figures.examples


def test_a_restarted_router_keeps_the_traffic_share(canary: LocalCanary, models) -> None:
    uris = models[0]
    router = canary.start(uris["good"], uris["good"])
    canary.set_percent(25.0)
    servers = {role: canary.deployment()[role].pid for role in ("champion", "candidate")}
    dead = canary.deployment()["router"].pid
    os.kill(dead, 9)
    _STARTED.pop(dead).wait()  # our child: reaped, so it is gone for certain
    restarted = canary.start(uris["good"], uris["good"])
    assert restarted != router
    assert {role: canary.deployment()[role].pid for role in servers} == servers  # the models kept serving
    status = json.loads(urllib.request.urlopen(f"{restarted}/canary/status").read())
    assert status["percent"] == 25.0
    assert _send(restarted, 10) == [200] * 10


def test_a_model_that_cannot_be_served_is_named(tmp_path: Path, models) -> None:
    backend = LocalCanary(tmp_path / "broken", LocalServing(), env=models[1])
    started = set(_STARTED)
    with pytest.raises(ServingError, match="the candidate model models:/m-missing did not start"):
        backend.start(models[0]["good"], "models:/m-missing")
    assert backend.deployment() == {}
    # The champion's server, which did start, is stopped too: nothing is left serving.
    assert [pid for pid in set(_STARTED) - started if _alive(pid)] == []
