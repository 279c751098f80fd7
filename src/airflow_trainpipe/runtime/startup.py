"""Where a training job's time goes before its first step.

Every attempt of every job pays it again: torchrun's own start, the interpreter and its imports,
DeepSpeed's op, the rendezvous, the fit, the engine, the checkpoint load and the MLflow run. A
tuning trial pays it once per job, so the study's device-hours count it (a pruned trial's saving
is smaller than its skipped epochs), and `make bench ONLY=startup` reads the phases from here.

The clock starts where the job did: torchrun's process (the parent of every rank), or this
process when it was started without torchrun (a test).
"""

from __future__ import annotations

import os
import time


def _job_started() -> float:
    """Epoch seconds when torchrun (or this process, without it) started."""
    import psutil

    me = psutil.Process()
    if "TORCHELASTIC_RUN_ID" in os.environ and (parent := me.parent()) is not None:
        return float(parent.create_time())
    return float(me.create_time())


class StartupClock:
    """Laps of the start-up, named after what ran in them; `total()` is the start-up so far."""

    def __init__(self) -> None:
        import psutil

        started = _job_started()
        rank_started = float(psutil.Process().create_time())
        now = time.time()
        self.phases: dict[str, float] = {}
        if rank_started > started:  # torchrun's own start, until it spawned this rank
            self.phases["torchrun"] = rank_started - started
        self.phases["interpreter_and_imports"] = now - rank_started
        self._last = now

    def lap(self, phase: str) -> None:
        """The time since the previous lap was spent on `phase`."""
        now = time.time()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self._last
        self._last = now

    def total(self) -> float:
        return sum(self.phases.values())

    def rounded(self) -> dict[str, float]:
        return {name: round(seconds, 3) for name, seconds in self.phases.items()}
