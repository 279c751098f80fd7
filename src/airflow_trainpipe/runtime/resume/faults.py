"""Fault injection for the resume tests: stop at a named point so the test controls the crash.

`TRAINPIPE_PAUSE_AT=save:20` pauses after step 20's checkpoint files are written but before its
completion marker, so a test can kill -9 the job there; `mid_step:17` pauses between backward and
optimizer step of step 17; `step:13` pauses after step 13. `TRAINPIPE_CRASH_AT` takes the same
values and makes every rank SIGKILL itself there instead (a worker dying on its own).
`TRAINPIPE_FAULT_TRY=1` limits both to the task's try 1 (`TRAINPIPE_TRY_NUMBER`, set by the
launchers): the retry runs clean, as after a real crash. `TRAINPIPE_FAULT_RUN=trial-001` limits
them to jobs whose run id contains it (one trial of a study whose trials run side by side). Unset
in production, where each call is one environment lookup.
"""

from __future__ import annotations

import os
import signal
import time

from airflow_trainpipe.contracts.events import write_line

_JOB = {"run_id": ""}


def fault_scope(run_id: str) -> None:
    """The job's run id, which TRAINPIPE_FAULT_RUN is matched against."""
    _JOB["run_id"] = run_id


def fault_point(name: str, step: int) -> None:
    point = f"{name}:{step}"
    only_try = os.environ.get("TRAINPIPE_FAULT_TRY")
    if only_try is not None and only_try != os.environ.get("TRAINPIPE_TRY_NUMBER"):
        return
    only_run = os.environ.get("TRAINPIPE_FAULT_RUN")
    if only_run is not None and only_run not in _JOB["run_id"]:
        return
    if os.environ.get("TRAINPIPE_PAUSE_AT") == point:
        write_line(f"TRAINPIPE PAUSED {point}")
        time.sleep(3600)
    if os.environ.get("TRAINPIPE_CRASH_AT") == point:
        write_line(f"TRAINPIPE CRASHING {point}")
        os.kill(os.getpid(), signal.SIGKILL)
