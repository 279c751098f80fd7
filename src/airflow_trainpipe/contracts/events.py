"""Machine-readable lines between the training job (rank 0) and the launchers that watch it.

`TRAINPIPE {"event": "progress", "step": 40, ...}` on stdout; anything else is plain log text.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

PREFIX = "TRAINPIPE "


def write_line(text: str) -> None:
    """One write(2) per line: every rank shares the pipe, and print() writes the text and the
    newline separately, which lets two ranks' lines interleave. A single write below PIPE_BUF
    (4 KiB) is atomic."""
    try:
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), (text + "\n").encode())
    except BrokenPipeError:
        pass  # the launcher that read it is gone (killed): what the job does next matters more


def emit(event: str, **fields: Any) -> None:
    write_line(PREFIX + json.dumps({"event": event, **fields}, default=float))


def parse(line: str) -> dict[str, Any] | None:
    # Found anywhere in the line: another rank's unterminated output may precede ours.
    start = line.find(PREFIX + "{")
    if start < 0:
        return None
    try:
        event = json.loads(line[start + len(PREFIX) :])
    except ValueError:
        return None
    return event if isinstance(event, dict) else None
