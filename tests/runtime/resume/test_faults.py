"""Fault points: a no-op unless the environment names exactly this point, then a pause or a SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

# Steps 12 and 13 of a training loop, each followed by a line the test can look for.
LOOP = """
from airflow_trainpipe.runtime.resume.faults import fault_point
for step in (12, 13):
    fault_point("step", step)
    print("after step", step, flush=True)
"""


def _env(**faults: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINPIPE_PAUSE_AT", "TRAINPIPE_CRASH_AT")}
    return {**env, **faults}


@pytest.mark.parametrize("named", [None, "step:14", "mid_step:13", "step:1", "step:13 ", "save:13"])
def test_a_point_not_named_exactly_passes_without_a_word(named: str | None) -> None:
    # In a child process: a wrong match would pause or SIGKILL the process running it.
    faults = {"TRAINPIPE_PAUSE_AT": named, "TRAINPIPE_CRASH_AT": named} if named else {}
    done = subprocess.run(
        [sys.executable, "-c", LOOP], env=_env(**faults), capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout) == (0, "after step 12\nafter step 13\n"), done.stderr[-2000:]


def test_a_crash_point_kills_the_process_there_after_saying_so() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOOP],
        env=_env(TRAINPIPE_CRASH_AT="step:13"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["after step 12", "TRAINPIPE CRASHING step:13"]


def test_a_pause_point_holds_the_process_there_after_saying_so() -> None:
    paused = subprocess.Popen(
        [sys.executable, "-c", LOOP],
        env=_env(TRAINPIPE_PAUSE_AT="step:13", TRAINPIPE_CRASH_AT="step:13"),  # the pause comes first
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert paused.stdout is not None
        assert [paused.stdout.readline() for _ in range(2)] == [
            "after step 12\n",
            "TRAINPIPE PAUSED step:13\n",
        ]
        time.sleep(0.5)
        assert paused.poll() is None  # still there, neither crashed nor past the point
    finally:
        paused.kill()
        paused.wait(timeout=30)
    assert "after step 13" not in paused.stdout.read()
