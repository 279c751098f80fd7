"""The local canary's weighted router: one address for clients, two models behind it.

`python -m airflow_trainpipe.canary.router --state DIR --champion URL --candidate URL`

Each `POST /invocations` goes to the candidate with the current weight's probability, else to the
champion; the answer returns to the client as soon as that model gives it. The other model then
scores the same body in the shadow (a small thread pool, off the client's path), and one line per
request lands in `DIR/requests.jsonl`: who answered, status, latency, both models' predictions.
The checks (canary/checks.py) read that file and nothing else, so a task that waits for a step can
be restarted anywhere without losing a request.

`PUT /canary/weight {"percent": p}` moves traffic (kept in `DIR/weight.json`, so a restarted router
resumes at the same share); `GET /canary/status` and `GET /ping` answer for monitoring. The stdlib
server keeps the router free of new dependencies; its overhead per request is in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from airflow_trainpipe.canary.state_files import write_json

REQUESTS_FILE = "requests.jsonl"
WEIGHT_FILE = "weight.json"
ROUTER_FILE = "router.json"
ROLES = ("champion", "candidate")


@dataclass
class Answer:
    status: int  # 0: no answer (refused, reset, timed out)
    body: bytes
    latency_ms: float


class Upstream:
    """One model server; a keep-alive connection per router thread."""

    def __init__(self, url: str, timeout_s: float):
        parts = urlsplit(url)
        self.host, self.port, self.timeout_s = parts.hostname or "127.0.0.1", parts.port or 80, timeout_s
        self._local = threading.local()

    def post(self, path: str, body: bytes, content_type: str) -> Answer:
        started = time.perf_counter()
        for attempt in (0, 1):  # a keep-alive connection the server closed meanwhile: reconnect once
            connection = self._connection(fresh=attempt == 1)
            try:
                connection.request("POST", path, body, {"Content-Type": content_type})
                response = connection.getresponse()
                data = response.read()
                return Answer(response.status, data, (time.perf_counter() - started) * 1000)
            except (ConnectionError, http.client.HTTPException):
                connection.close()
            except OSError:  # timed out: no second try, the client is waiting
                connection.close()
                break
        return Answer(0, b"", (time.perf_counter() - started) * 1000)

    def _connection(self, fresh: bool) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None or fresh:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            self._local.connection = connection
        return connection


class Router:
    def __init__(self, state: Path, upstreams: dict[str, Upstream | None]):
        self.state, self.upstreams = state, upstreams
        self.percent = _read_weight(state)
        self._log_lock = threading.Lock()
        self._log = (state / REQUESTS_FILE).open("a", buffering=1)
        self._shadow = ThreadPoolExecutor(8, thread_name_prefix="shadow")
        self.counts = {"champion": 0, "candidate": 0}

    def set_percent(self, percent: float) -> None:
        write_json(self.state / WEIGHT_FILE, {"percent": percent, "at": time.time()})
        self.percent = percent

    def route(self, body: bytes, content_type: str) -> Answer:
        percent = self.percent
        role = "candidate" if random.random() * 100 < percent else "champion"
        if self.upstreams[role] is None:  # after a rollback or a promotion one model is left
            role = ROLES[1 - ROLES.index(role)]
        upstream = self.upstreams[role]
        assert upstream is not None
        received = time.time()
        answer = upstream.post("/invocations", body, content_type)
        with self._log_lock:
            self.counts[role] += 1
        other = self.upstreams[ROLES[1 - ROLES.index(role)]]
        record = {"t": received, "percent": percent, "role": role, "status": answer.status,
                  "latency_ms": round(answer.latency_ms, 3), "answer": _predictions(answer)}  # fmt: skip
        if other is None:
            self._write(record)
        else:
            self._shadow.submit(self._shadow_score, other, body, content_type, record)
        return answer

    def _shadow_score(self, other: Upstream, body: bytes, content_type: str, record: dict[str, Any]) -> None:
        shadow = other.post("/invocations", body, content_type)
        self._write(
            {**record, "shadow_status": shadow.status, "shadow_latency_ms": round(shadow.latency_ms, 3),
             "shadow": _predictions(shadow)}
        )  # fmt: skip

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._log_lock:
            self._log.write(line)


def _predictions(answer: Answer) -> Any:
    if answer.status != 200:
        return None
    try:
        return json.loads(answer.body)["predictions"]
    except (ValueError, KeyError, TypeError):
        return None


def _read_weight(state: Path) -> float:
    try:
        return float(json.loads((state / WEIGHT_FILE).read_text())["percent"])
    except (OSError, ValueError, KeyError):
        return 0.0


def _handler(router: Router) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a client's connection is reused

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/invocations":
                self._reply(404, b'{"error": "POST /invocations"}')
                return
            answer = router.route(body, self.headers.get("Content-Type") or "application/json")
            if answer.status == 0:
                self._reply(504, b'{"error": "the model did not answer"}')
            else:
                self._reply(answer.status, answer.body)

        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/canary/weight":
                self._reply(404, b"{}")
                return
            router.set_percent(float(json.loads(body)["percent"]))
            self._reply(200, json.dumps({"percent": router.percent}).encode())

        def do_GET(self) -> None:
            if self.path == "/ping":
                self._reply(200, b"{}")
            elif self.path == "/canary/status":
                self._reply(200, json.dumps({"percent": router.percent, "requests": router.counts}).encode())
            else:
                self._reply(404, b"{}")

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one JSON line per request is the log; the access log would double it

    return Handler


def serve(
    state: Path, champion: str | None, candidate: str | None, host: str, port: int, timeout_s: float
) -> None:
    state.mkdir(parents=True, exist_ok=True)
    upstreams = {
        "champion": Upstream(champion, timeout_s) if champion else None,
        "candidate": Upstream(candidate, timeout_s) if candidate else None,
    }
    router = Router(state, upstreams)
    server = ThreadingHTTPServer((host, port), _handler(router))
    server.daemon_threads = True
    address = f"http://{host}:{server.server_address[1]}"
    # Written once it listens: the file's presence means ready.
    write_json(state / ROUTER_FILE, {"url": address, "pid": os.getpid()})
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m airflow_trainpipe.canary.router")
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--champion")
    parser.add_argument("--candidate")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    args = parser.parse_args(argv)
    serve(args.state, args.champion, args.candidate, args.host, args.port, args.timeout_s)


if __name__ == "__main__":
    main()
