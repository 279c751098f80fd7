"""SIGTERM is a preemption notice: finish the step, write a complete checkpoint, exit retryable.

A spot reclaim, a pod deletion and an Airflow task kill all arrive as SIGTERM, 30 to 120 s
before SIGKILL. Dying at once would lose everything since the last periodic checkpoint, so:

- The Python handler only keeps the process alive. What acts on the signal is a thread woken
  through `signal.set_wakeup_fd`, which the C-level handler writes at once even while the main
  thread is blocked in a collective or in DeepSpeed's C++ code (Python handlers wait for it).
  The thread starts the grace clock and, when the grace runs out, exits the rank with
  PREEMPTED_EXIT: a save that did not finish in time is abandoned before its marker, so the
  previous checkpoint stays the newest complete one.
- Ranks receive the signal at different steps, yet must save the same one. After every step each
  rank starts a non-blocking all-reduce of its flag on a group of its own and reads the previous
  step's result: the reduction overlaps the next step's compute, and every rank sees the same
  value at the same step, so all stop together one step after the first one was signalled.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from airflow_trainpipe.events import write_line
from airflow_trainpipe.exceptions import TrainpipeError

PREEMPTED_EXIT = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


class Preempted(TrainpipeError):
    """The job was told to stop (SIGTERM) and saved where it was: another try continues from there."""

    retryable = True


class PreemptionNotice:
    """This rank's SIGTERM: when it came, and the grace clock that ends the rank if saving hangs."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.signalled_at: float | None = None
        self.saved = threading.Event()  # set once the checkpoint is complete: the clock stops
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        # The handler must exist (the default action kills); the wakeup fd does the work.
        signal.signal(signal.SIGTERM, lambda *_: None)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._sockets = (reader, writer)  # kept open for the life of the process
        threading.Thread(target=self._watch, args=(reader,), name="preemption", daemon=True).start()

    @property
    def signalled(self) -> bool:
        return self.signalled_at is not None

    def seconds_since_signal(self) -> float:
        return 0.0 if self.signalled_at is None else time.monotonic() - self.signalled_at

    def _watch(self, reader: socket.socket) -> None:
        while signal.SIGTERM not in reader.recv(64):
            pass  # another signal with a Python handler (SIGINT) also writes its number here
        self.signalled_at = time.monotonic()
        _say(
            f"SIGTERM: finishing the current step and saving a checkpoint "
            f"(training.checkpoint.preemption_grace {self.grace_s:g} s)"
        )
        if self.saved.wait(self.grace_s):
            return
        _say(
            f"preemption save abandoned after {self.grace_s:g} s: exiting before its completion "
            "marker, so the previous complete checkpoint is the one resumed from"
        )
        os._exit(PREEMPTED_EXIT)


class PreemptionVote:
    """Collective: whether any rank has been signalled, agreed on by every rank at the same step."""

    def __init__(self, notice: PreemptionNotice | None, world_size: int):
        self.notice = notice
        self.group = dist.new_group(backend="gloo") if world_size > 1 else None
        self._pending: Any = None
        self._flag = torch.zeros(1, dtype=torch.int32)

    def stop_after_step(self) -> bool:
        """Call after every step on every rank; True on all ranks at once."""
        signalled = self.notice is not None and self.notice.signalled
        if self.group is None:
            return signalled
        agreed = False
        if self._pending is not None:
            self._pending.wait()
            agreed = bool(self._flag.item())
        self._flag = torch.tensor([int(signalled)], dtype=torch.int32)
        self._pending = dist.all_reduce(self._flag, group=self.group, async_op=True)
        return agreed

    def drain(self) -> None:
        """Wait for the reduction in flight (every rank started the same number of them)."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None


def _say(text: str) -> None:
    write_line(f"[rank{os.environ.get('RANK', '0')}] {text}")
