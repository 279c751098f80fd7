"""Callers of a local canary: rows sent one per request to its router, as the model's clients
send them (`trainpipe canary-replay`; the tests' traffic).

A canary's steps are judged on requests, so a canary with no callers fails every step for too
little traffic. In production the callers are real; replaying a day's rows exercises a canary in
staging or on a laptop (`make up` replays today's rows to `fraud_detector_canary`).

A canary is found by its state folder (TRAINPIPE_HOME/canary/<pipeline>/v<version>/router.json);
its caller stops when the file goes (the next canary of the pipeline stopped that router).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from airflow_trainpipe.canary.router import ROUTER_FILE


class CanaryCaller(threading.Thread):
    """Sends `rows` in turn, one per request, `per_second` a second, to the router named in
    `state`/router.json (waiting for it to appear) until stopped or the file goes.

    Every answer's status goes to `statuses`; a request that found no router listening is
    recorded (its time) in `unreachable`."""

    def __init__(self, state: Path, rows: list[dict[str, Any]], per_second: float = 20.0) -> None:
        super().__init__(daemon=True, name=f"canary-caller-{state.parent.name}-{state.name}")
        if not rows:
            raise ValueError("a caller needs at least one row to send")
        self.state, self.rows, self.pause = state, rows, 1.0 / per_second
        self.stopped = threading.Event()
        self.statuses: list[int] = []
        self.unreachable: list[float] = []

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
        except urllib.error.HTTPError as error:
            self.statuses.append(error.code)
        except OSError:
            self.unreachable.append(time.time())
            time.sleep(0.5)  # not listening (yet, or any more): no busy loop


def call_every_canary(
    pipeline_state: Path, rows: list[dict[str, Any]], per_second: float, stop: threading.Event
) -> None:
    """A caller for each canary of a pipeline (`pipeline_state`: TRAINPIPE_HOME/canary/<pipeline>)
    that serves now or starts serving later, until `stop` is set."""
    callers: dict[Path, CanaryCaller] = {}
    while not stop.is_set():
        for router_file in sorted(pipeline_state.glob(f"v*/{ROUTER_FILE}")):
            state = router_file.parent
            if state not in callers or not callers[state].is_alive():
                callers[state] = CanaryCaller(state, rows, per_second)
                callers[state].start()
                print(f"calling the canary of version {state.name[1:]} ({state})", flush=True)
        stop.wait(2.0)
    for caller in callers.values():
        caller.stop()
