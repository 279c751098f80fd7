"""Process lifetime on Linux: a child that outlives its parent keeps training unseen."""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def signal_on_parent_death(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies, whatever killed it.

    SIGTERM rather than SIGKILL: the training job treats it as a preemption notice and saves a
    checkpoint first (runtime/resume/preemption.py), and its grace clock still ends it if saving hangs.
    Safe in a `preexec_fn`: it only calls prctl.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
    # Reparented already: the parent died before prctl took effect. (Not `ppid == 1`: in a
    # container the parent, torchrun, is pid 1 itself.)
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
