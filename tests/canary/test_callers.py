"""The canary's callers (canary/callers.py) and `trainpipe canary-replay`: rows go one per request
to the address in a canary's router.json, a caller ends when that file goes, every canary of a
pipeline gets one, and the replayed rows are the day's snapshot reduced to the feature columns.

The router here is a real HTTP server on 127.0.0.1 that records what it receives (the router with
real models behind it is tests/canary/test_local.py's and tests/integration's)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from airflow_trainpipe.canary.callers import CanaryCaller, call_every_canary
from airflow_trainpipe.canary.router import ROUTER_FILE
from tests.conftest import EXAMPLE_CONFIGS, free_port


class Recorder(ThreadingHTTPServer):
    """Answers every POST with `status` and `answer` and keeps (path, body)."""

    def __init__(self, status: int = 200, answer: bytes = b"{}") -> None:
        self.received: list[tuple[str, dict]] = []
        self.status, self.answer = status, answer
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                recorder.received.append((self.path, json.loads(body)))
                self.send_response(recorder.status)
                self.send_header("Content-Length", str(len(recorder.answer)))
                self.end_headers()
                self.wfile.write(recorder.answer)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    yield server
    server.shutdown()
    server.server_close()


def _serve(state: Path, url: str) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / ROUTER_FILE).write_text(json.dumps({"url": url}))


def _wait(what: str, check, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


ROWS = [
    {"amount": 10.0, "channel": "web"},
    {"amount": 20.0, "channel": "pos"},
    {"amount": 30.0, "channel": "app"},
]


def test_a_caller_sends_the_rows_in_turn_one_per_request_and_ends_when_the_router_file_goes(
    recorder: Recorder, tmp_path: Path
) -> None:
    state = tmp_path / "canary" / "fraud" / "v2"
    caller = CanaryCaller(state, ROWS, per_second=200)
    caller.start()
    time.sleep(0.3)
    assert recorder.received == []  # no router yet: it waits, sends nothing
    _serve(state, recorder.url)
    _wait("five requests", lambda: len(recorder.received) >= 5)
    (state / ROUTER_FILE).unlink()
    caller.join(timeout=10)
    assert not caller.is_alive()
    paths = {path for path, _ in recorder.received}
    records = [body["dataframe_records"] for _, body in recorder.received]
    assert paths == {"/invocations"}
    assert records[:5] == [[ROWS[0]], [ROWS[1]], [ROWS[2]], [ROWS[0]], [ROWS[1]]]
    assert caller.statuses == [200] * len(recorder.received) and caller.unreachable == []


def test_a_caller_counts_the_classes_its_answers_name_and_sums_them_up(tmp_path: Path) -> None:
    labelled = Recorder(
        answer=json.dumps({"predictions": [{"probability": 0.7, "predicted_label": 1}]}).encode()
    )
    try:
        state = tmp_path / "canary" / "fraud" / "v3"
        _serve(state, labelled.url)
        caller = CanaryCaller(state, ROWS, per_second=200)
        caller.start()
        _wait("four answers", lambda: len(caller.statuses) >= 4)
        caller.stop()
    finally:
        labelled.shutdown()
        labelled.server_close()
    answers = len(caller.statuses)
    assert caller.labels == {"1": answers}
    assert (
        caller.summary() == f"version 3: {answers} answers (200 x {answers}); predicted_label: 1 x {answers}"
    )


def test_error_answers_are_counted_and_a_router_that_is_not_listening_is_recorded(
    recorder: Recorder, tmp_path: Path
) -> None:
    recorder.status = 503
    answering, silent = tmp_path / "v1", tmp_path / "v2"
    _serve(answering, recorder.url)
    _serve(silent, f"http://127.0.0.1:{free_port()}")
    callers = [CanaryCaller(answering, ROWS, per_second=100), CanaryCaller(silent, ROWS, per_second=100)]
    for caller in callers:
        caller.start()
    _wait("answers and refusals", lambda: len(callers[0].statuses) >= 3 and len(callers[1].unreachable) >= 2)
    for caller in callers:
        caller.stop()
    assert set(callers[0].statuses) == {503} and callers[0].labels == {}
    assert callers[0].summary().endswith(f"answers (503 x {len(callers[0].statuses)})")
    assert callers[1].statuses == [] and all(t <= time.time() for t in callers[1].unreachable)


def test_every_canary_of_the_pipeline_gets_a_caller_also_one_that_starts_later(
    recorder: Recorder, tmp_path: Path
) -> None:
    pipeline = tmp_path / "canary" / "fraud"
    _serve(pipeline / "v1", recorder.url)
    later = Recorder()
    stop = threading.Event()
    calling = threading.Thread(target=call_every_canary, args=(pipeline, ROWS, 100, stop), daemon=True)
    calling.start()
    try:
        _wait("requests to the first canary", lambda: len(recorder.received) >= 2)
        assert later.received == []
        _serve(pipeline / "v2", later.url)
        _wait("requests to the canary that started later", lambda: len(later.received) >= 2)
    finally:
        stop.set()
        calling.join(timeout=30)
        later.shutdown()
        later.server_close()
    assert not calling.is_alive()


def test_canary_replay_sends_the_day_s_feature_columns_and_refuses_a_pipeline_without_a_local_canary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_trainpipe.cli.canary import replay_rows
    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.examples.synthetic import write_day

    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    write_day((tmp_path / "home" / "data" / "card_transactions").as_uri(), date(2026, 1, 3), 300, seed=3)
    config = load_config(EXAMPLE_CONFIGS / "fraud_detector_canary.yaml")
    rows = replay_rows(config, "2026-01-03", 120)
    assert len(rows) == 120
    assert set(rows[0]) == set(config.data.features.all)  # no label, no partition column, no key
    assert {type(rows[0]["amount"]), type(rows[0]["channel"])} == {float, str}

    trainpipe = str(Path(sys.executable).parent / "trainpipe")
    without = subprocess.run(
        [trainpipe, "canary-replay", str(EXAMPLE_CONFIGS / "fraud_detector.yaml"), "--ds", "2026-01-03"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert without.returncode == 1 and "set `canary.backend: local`" in without.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        (EXAMPLE_CONFIGS / "fraud_detector_canary.yaml")
        .read_text()
        .replace("steps: [10, 50, 100]", "steps: [50, 10]")
    )
    refused = subprocess.run(
        [trainpipe, "canary-replay", str(broken)], capture_output=True, text=True, timeout=120
    )
    assert (
        refused.returncode == 1 and "broken.yaml:134:15: canary.steps[1]: must be above" in refused.stderr
    ), refused.stderr
