"""The canary's state files: written whole or not at all.

The router, the task that starts a canary and the steps that wait in the triggerer are separate
processes reading each other's files (weights, addresses, pids, step windows) while they are
rewritten: a reader must see the old content or the new, never half of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: Path, value: Any) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value))
    os.replace(temporary, path)
