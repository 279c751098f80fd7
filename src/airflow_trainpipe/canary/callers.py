"""Callers of a local canary: rows sent one per request to its router, as the model's clients
send them (`trainpipe canary-replay`; the tests' traffic).

A canary's steps are judged on requests, so a canary with no callers fails every step for too
little traffic. In production the callers are real; replaying a day's rows exercises a canary in
staging or on a laptop (`make up` replays today's rows to `fraud_detector_canary`).

A canary is found by its state folder (TRAINPIPE_HOME/canary/<pipeline>/v<version>/router.json);
its caller stops when the file goes (the next canary of the pipeline stopped that router).
Each caller counts the classes its answers name (their `predicted_label`, contracts/predictions.py):
printed per canary when the replay stops, a look at what the served versions decided on the day.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from airflow_trainpipe.canary.router import ROUTER_FILE
from airflow_trainpipe.contracts.predictions import PREDICTED_LABEL


class CanaryCaller(threading.Thread):
    """Sends `rows` in turn, one per request, `per_second` a second, to the router named in
    `state`/router.json (waiting for it to appear) until stopped or the file goes.

    Every answer's status goes to `statuses`, the class each answered row names to `labels`
    (rows of a model without the label column are not counted); a request that found no router
    listening is recorded (its time) in `unreachable`."""

    def __init__(self, state: Path, rows: list[dict[str, Any]], per_second: float = 20.0) -> None:
        super().__init__(daemon=True, name=f"canary-caller-{state.parent.name}-{state.name}")
        if not rows:
            raise ValueError("a caller needs at least one row to send")
        self.state, self.rows, self.pause = state, rows, 1.0 / per_second
        self.stopped = threading.Event()
        self.statuses: list[int] = []
        self.unreachable: list[float] = []
        self.labels: Counter[str] = Counter()

    def run(self) -> None:
        router_file = self.state / ROUTER_FILE
        while not self.stopped.is_set() and not router_file.exists():
            time.sleep(0.2)
        sent = 0
        while not self.stopped.is_set():
            try:
                router = json.loads(router_file.read_text())["url"]
            except FileNotFoundError:
                return  # the canary's serving set was stopped
            self._send(router, self.rows[sent % len(self.rows)])
            sent += 1
            time.sleep(self.pause)

    def stop(self, timeout: float = 15.0) -> None:
        self.stopped.set()
        self.join(timeout)

    def _send(self, router: str, row: dict[str, Any]) -> None:
        request = urllib.request.Request(
            f"{router}/invocations",
            data=json.dumps({"dataframe_records": [row]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                self.statuses.append(response.status)
                self._count_labels(response.read())
        except urllib.error.HTTPError as error:
            self.statuses.append(error.code)
        except OSError:
            self.unreachable.append(time.time())
            time.sleep(0.5)  # not listening (yet, or any more): no busy loop

    def _count_labels(self, body: bytes) -> None:
        try:
            rows = json.loads(body).get("predictions")
        except (ValueError, AttributeError):
            return  # not an MLflow answer: its status alone counts
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict) and PREDICTED_LABEL in row:
                self.labels[str(row[PREDICTED_LABEL])] += 1

    def summary(self) -> str:
        """One line: the answers' statuses and the classes they named."""
        statuses = ", ".join(f"{s} x {n}" for s, n in sorted(Counter(self.statuses).items()))
        line = f"version {self.state.name[1:]}: {len(self.statuses)} answers ({statuses or 'none'})"
        if self.labels:
            named = ", ".join(f"{label} x {n}" for label, n in sorted(self.labels.items()))
            line += f"; {PREDICTED_LABEL}: {named}"
        return line


def call_every_canary(
    pipeline_state: Path, rows: list[dict[str, Any]], per_second: float, stop: threading.Event
) -> None:
    """A caller for each canary of a pipeline (`pipeline_state`: TRAINPIPE_HOME/canary/<pipeline>)
    that serves now or starts serving later, until `stop` is set (or the call is interrupted);
    then one line per canary (`CanaryCaller.summary`)."""
    callers: dict[Path, CanaryCaller] = {}
    try:
        while not stop.is_set():
            for router_file in sorted(pipeline_state.glob(f"v*/{ROUTER_FILE}")):
                state = router_file.parent
                if state not in callers or not callers[state].is_alive():
                    callers[state] = CanaryCaller(state, rows, per_second)
                    callers[state].start()
                    print(f"calling the canary of version {state.name[1:]} ({state})", flush=True)
            stop.wait(2.0)
    finally:  # Ctrl-C too: each canary's answers and the classes they named
        for caller in callers.values():
            caller.stop()
            print(caller.summary(), flush=True)
