"""DeepSpeed's JIT-built ops: a build that died must not stop every later job.

On CPU, DeepSpeed compiles a communication op the first time a job starts (~40 s on 2 cores),
under `<torch extensions dir>/<op>/lock`. torch creates that file, builds, and deletes it; a build
killed on the way (Ctrl-C in a first `make demo`, a task timeout, a pod eviction) leaves it
behind, and torch's FileBaton then waits for it to disappear, silently and forever: every later
job hangs before its first step. A lock older than any real build is from a dead builder.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)

STALE_AFTER_S = 600  # a CPU build takes ~40 s on 2 cores; GPU ops a few minutes


def clear_stale_build_locks(
    root: str | Path | None = None, stale_after_s: float = STALE_AFTER_S
) -> list[Path]:
    """Remove build locks older than `stale_after_s` under the extensions root; returns them."""
    if root is None:
        from torch.utils.cpp_extension import get_default_build_root

        root = get_default_build_root()
    removed = []
    for lock in Path(root).glob("*/lock"):
        try:
            age = time.time() - lock.stat().st_mtime
            if age > stale_after_s:
                lock.unlink()
                removed.append(lock)
                log.warning(
                    "removed %s, left %.0f s ago by a build that died; the op is rebuilt or reused", lock, age
                )
        except FileNotFoundError:
            pass  # another rank removed it, or the builder finished
    return removed
