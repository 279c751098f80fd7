"""Where a training job's time goes before its first step.

Every attempt of every job pays it again: torchrun's own start, the interpreter and its imports,
DeepSpeed's op, the rendezvous, the fit, the engine, the checkpoint load and the MLflow run. A
tuning trial pays it once per job, so the study's device-hours count it (a pruned trial's saving
is smaller than its skipped epochs), and `make bench ONLY=tuning` reads the phases from here.

The clock starts where the job did: torchrun's process (the parent of every rank), or this
process when it was started without torchrun (a test).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def _age(pid: int) -> float:
    """Seconds since process `pid` started. Linux's own clock (/proc: ticks since boot against
    uptime), not psutil's create_time, whose boot time is whole seconds (up to 1 s off)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, IndexError, ValueError):
        import psutil

        return time.time() - float(psutil.Process(pid).create_time())


class StartupClock:
    """Laps of the start-up, named after what ran in them; `total()` is the start-up so far."""

    def __init__(self) -> None:
        rank_age = _age(os.getpid())
        # Under torchrun the job started with torchrun, the parent of every rank.
        job_age = _age(os.getppid()) if "TORCHELASTIC_RUN_ID" in os.environ else rank_age
        self.phases: dict[str, float] = {}
        if job_age > rank_age:  # torchrun's own start, until it spawned this rank
            self.phases["torchrun"] = job_age - rank_age
        self.phases["interpreter_and_imports"] = rank_age
        self._last = time.time()

    def lap(self, phase: str) -> None:
        """The time since the previous lap was spent on `phase`."""
        now = time.time()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    def total(self) -> float:
        return sum(self.phases.values())

    def rounded(self) -> dict[str, float]:
        return {name: round(seconds, 3) for name, seconds in self.phases.items()}


class Laps:
    """Named laps of a stretch of the job that is not its start (the end: runtime/finish.py)."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    def rounded(self) -> dict[str, float]:
        return {name: round(seconds, 3) for name, seconds in self.phases.items()}
