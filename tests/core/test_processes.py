"""A process started with signal_on_parent_death() gets SIGTERM when its parent dies, however."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

# -- a rank dies with its parent ---------------------------------------------------------------

# The rank imports the small module only (importing the whole entrypoint costs a dozen seconds).
# It keeps SIGTERM's default action: the training job's own handler is tested with real jobs.
ARMED = """
import time
from airflow_trainpipe.core.processes import signal_on_parent_death
signal_on_parent_death()
print("ready", flush=True)
time.sleep(300)
"""
UNARMED = "import time; print('ready', flush=True); time.sleep(300)"
# The stand-in for torchrun: starts the rank, says its pid, and waits.
PARENT = """
import subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(rank.pid, flush=True)
rank.wait()
"""


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


@pytest.mark.parametrize(("rank_code", "dies"), [(ARMED, True), (UNARMED, False)], ids=["armed", "unarmed"])
def test_a_rank_is_killed_when_its_parent_dies(rank_code: str, dies: bool) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, rank_code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    rank = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline() == "ready\n"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        assert _gone_within(rank, 10.0 if dies else 1.0) is dies
    finally:
        parent.kill()
        parent.stdout.close()
        if not _gone_within(rank, 0):
            psutil.Process(rank).kill()
