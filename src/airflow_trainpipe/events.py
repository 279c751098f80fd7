"""Machine-readable lines between the training job (rank 0) and the launchers that watch it.

`TRAINPIPE {"event": "progress", "step": 40, ...}` on stdout; anything else is plain log text.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX = "TRAINPIPE "


def emit(event: str, **fields: Any) -> None:
    print(PREFIX + json.dumps({"event": event, **fields}, default=float), flush=True)


def parse(line: str) -> dict[str, Any] | None:
    if not line.startswith(PREFIX + "{"):
        return None
    try:
        return json.loads(line[len(PREFIX) :])
    except ValueError:
        return None
