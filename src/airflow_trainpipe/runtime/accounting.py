"""What a training run spent: wall and device time over all attempts, and the steps it recomputed.

Both survive a retry: device time rides in the checkpoint's client state; the step high-water mark
lives in the run directory, where an attempt on another node or in a new pod finds it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from airflow_trainpipe.core.storage import filesystem, is_local, join, node_local_dir

log = logging.getLogger(__name__)

MARK_FILE = "step_high_water.json"
_MARK_WIDTH = 40  # bytes: every write covers the whole file (JSON allows the trailing spaces)


class StepHighWater:
    """The highest step any attempt of this run reached, so a resumed attempt can say how many
    steps it recomputes.

    Each step is written to this node's disk at once: exact when the retry runs on the same node
    (and for a file:// run directory, which is that location). A remote run directory (s3://)
    also gets the mark from a background thread that uploads the newest step, one PUT at a time,
    so the training loop never waits on the store; a new pod reads it there, behind by at most
    the steps of the last upload in flight when the previous attempt was killed.
    """

    def __init__(self, run_dir: str):
        local = node_local_dir(run_dir, "step_high_water")
        local.mkdir(parents=True, exist_ok=True)
        self.path = local / MARK_FILE
        self.remote = None if is_local(run_dir) else join(run_dir, MARK_FILE)
        self._latest: int | None = None
        self._uploaded: int | None = None
        self._changed = threading.Condition()
        self._uploader: threading.Thread | None = None
        self._fd: int | None = None

    def high_water(self) -> int:
        steps = [self._read_local()]
        if self.remote is not None:
            fs, path = filesystem(self.remote)
            with suppress(FileNotFoundError):
                steps.append(int(json.loads(fs.cat_file(path))["step"]))
        return max(steps)

    def _read_local(self) -> int:
        try:
            return int(json.loads(self.path.read_text())["step"])
        except (FileNotFoundError, ValueError, KeyError):
            return 0

    def record(self, step: int) -> None:
        # One pwrite of a fixed width into the open file, every step: a temporary file and a
        # rename cost ~0.3 ms, 3% of a small model's step, and the other ranks wait for rank 0 at
        # the next all-reduce. A killed process cannot tear a write it made, and a reader that
        # somehow meets a torn one reads no mark (0), as before the first step.
        first = self._fd is None
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(self._fd, json.dumps({"step": step}).ljust(_MARK_WIDTH).encode(), 0)
        if first:  # whatever was longer before (another writer's mark) ends with this one
            os.ftruncate(self._fd, _MARK_WIDTH)
        if self.remote is None:
            return
        with self._changed:
            self._latest = step
            self._changed.notify()
        if self._uploader is None:
            self._uploader = threading.Thread(
                target=self._upload_newest, args=(self.remote,), name="step-high-water", daemon=True
            )
            self._uploader.start()

    def _upload_newest(self, remote: str) -> None:
        fs, path = filesystem(remote)
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._latest != self._uploaded)
                step = self._latest
            try:
                fs.pipe_file(path, json.dumps({"step": step}).encode())
            except Exception as exc:  # only the recomputed-steps figure depends on it: never stop training
                log.warning("could not record step %s at %s: %s", step, self.remote, exc)
                time.sleep(1)
            with self._changed:
                self._uploaded = step
                self._changed.notify_all()

    def flush(self, timeout: float = 30) -> None:
        """Wait until the newest step is in the run directory (end of the job)."""
        if self._uploader is None:
            return
        with self._changed:
            self._changed.wait_for(lambda: self._uploaded == self._latest, timeout=timeout)


@dataclass
class Timing:
    """Where this attempt's wall time went; `make bench` reads it from result.json.

    Device time is wall time times the attempt's actual world size (one device per process), summed
    over attempts: a retry on fewer or more processes is counted as it ran, not as configured.
    """

    first_step: int
    earlier_compute_s: float
    world_size: int = 1
    earlier_device_s: float = 0.0
    startup_s: float = 0.0
    """This attempt's start-up before the loop (runtime.startup): device time as much as a step."""
    startup: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    data_wait_s: float = 0.0
    checkpoint_s: float = 0.0
    eval_s: float = 0.0
    study_s: float = 0.0
    """A tuning trial's round trips to its study at rung ends (report, should_prune): work a job
    without rungs never does, so the full-budget estimate of a pruned trial must leave it out."""

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def compute_s(self) -> float:
        """Job time over all attempts up to now, start-up included (lost work of killed attempts excluded)."""
        return self.earlier_compute_s + self.startup_s + self.elapsed()

    def device_s(self) -> float:
        """Device-seconds over all attempts up to now, start-up included (lost work of killed
        attempts excluded)."""
        return self.earlier_device_s + (self.startup_s + self.elapsed()) * self.world_size

    @contextmanager
    def measure(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            setattr(self, name, getattr(self, name) + time.monotonic() - t0)

    def summary(self, last_step: int) -> dict[str, Any]:
        loop = self.elapsed()
        return {
            "steps": last_step - self.first_step,
            "loop_s": loop,
            "train_s": loop - self.eval_s - self.study_s,
            "checkpoint_s": self.checkpoint_s,
            "eval_s": self.eval_s,
            "study_s": self.study_s,
            "data_wait_s": self.data_wait_s,
            "startup_s": self.startup_s,
            "startup": self.startup,
        }
