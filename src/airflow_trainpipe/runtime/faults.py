"""Fault injection for the resume tests: stop at a named point so the test controls the crash.

`TRAINPIPE_PAUSE_AT=save:20` pauses after step 20's checkpoint files are written but before its
completion marker, so a test can kill -9 the job there; `mid_step:17` pauses between backward and
optimizer step of step 17; `step:13` pauses after step 13. `TRAINPIPE_CRASH_AT` takes the same
values and makes every rank SIGKILL itself there instead (a worker dying on its own). Unset in
production, where each call is one environment lookup.
"""

from __future__ import annotations

import os
import signal
import time

from airflow_trainpipe.events import write_line


def fault_point(name: str, step: int) -> None:
    point = f"{name}:{step}"
    if os.environ.get("TRAINPIPE_PAUSE_AT") == point:
        write_line(f"TRAINPIPE PAUSED {point}")
        time.sleep(3600)
    if os.environ.get("TRAINPIPE_CRASH_AT") == point:
        write_line(f"TRAINPIPE CRASHING {point}")
        os.kill(os.getpid(), signal.SIGKILL)
