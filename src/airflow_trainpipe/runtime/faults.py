"""Fault injection for the resume tests: pause at a named point so a test can kill -9 there.

`TRAINPIPE_PAUSE_AT=save:200` pauses after step 200's checkpoint files are written but before
its completion marker; `mid_step:137` pauses between backward and optimizer step of step 137;
`step:105` pauses after step 105. Unset in production, where this is a string comparison.
"""

from __future__ import annotations

import os
import time


def pause_point(name: str, step: int) -> None:
    if os.environ.get("TRAINPIPE_PAUSE_AT") == f"{name}:{step}":
        print(f"TRAINPIPE PAUSED {name}:{step}", flush=True)
        time.sleep(3600)
