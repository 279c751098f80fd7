"""DeepSpeed's JIT-built ops: a build that died must not stop every later job.

On CPU, DeepSpeed compiles a communication op the first time a job starts (~40 s on 2 cores),
under `<torch extensions dir>/<op>/lock`. torch creates that file, builds, and deletes it; a build
killed on the way (Ctrl-C in a first `make demo`, a task timeout, a pod eviction) leaves it
behind, and torch's FileBaton then waits for it to disappear, silently and forever: every later
job hangs before its first step. torch takes that lock on every load, not only on builds, so a
rank SIGKILLed during its first second of life leaves one too (seen in a preemption bench).

Two defences. The communication op every CPU job loads is loaded before `init_distributed`
under an flock of ours (`load_comm_op`): the kernel releases an flock when its holder dies, so
whoever holds it knows a FileBaton lock of that op is a dead loader's and removes it at once. Any
other op's lock is removed once it is older than any real build (`clear_stale_build_locks`).

A build folder also holds one build only. Its command spells the include paths of Python, torch
and DeepSpeed as the loading interpreter sees them, and ninja rebuilds whenever the command differs
from the last one. Two interpreters sharing the folder (two virtualenvs under the user's default
`~/.cache/torch_extensions`, one venv reached through a symlink and through its real path, a
system ninja and pip's) therefore rebuilt the op in turn, 40-75 s before the first step of every
job that followed the other kind (the test machine's build log held 25 such rebuilds in five
hours of two checkouts' runs). So each build layout gets a folder of its own under the root
(`use_layout_build_root`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

STALE_AFTER_S = 600  # a CPU build takes ~40 s on 2 cores; GPU ops a few minutes


def clear_stale_build_locks(
    root: str | Path | None = None, stale_after_s: float = STALE_AFTER_S
) -> list[Path]:
    """Remove build locks older than `stale_after_s` under the extensions root; returns them."""
    root = extensions_root() if root is None else root
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


FLOCK = "trainpipe-build.flock"
COMM_OP = "ShareMemCommBuilder"  # deepspeed.comm.torch.build_shm_op loads it on CPU
COMM_OP_NAME = "deepspeed_shm_comm"  # its build directory
LAYOUT_PREFIX = "layout-"  # our per-layout folders under torch's extensions root
EXTENSIONS_ENV = "TORCH_EXTENSIONS_DIR"


def build_layout() -> dict[str, str]:
    """What an op's build command takes from this interpreter besides its sources and flags: the
    include folders of Python, torch and DeepSpeed as spelled here (torch and DeepSpeed take them
    from their `__file__`, symlinks unresolved), the version of the ninja on PATH (pip's 1.13 writes
    a build log of another version than Debian's 1.11, and the two rebuilt each other's op) and the
    compiler."""
    import deepspeed
    import torch

    return {
        "python": sysconfig.get_paths()["include"],
        "version": sys.version,
        "torch": os.path.dirname(os.path.abspath(torch.__file__)),
        "deepspeed": os.path.dirname(os.path.abspath(deepspeed.__file__)),
        "ninja": _ninja_version(),
        "cxx": os.environ.get("CXX", ""),
    }


def _ninja_version() -> str:
    """The version torch's build will run (it runs the first `ninja` on PATH, as here), or ""."""
    ninja = shutil.which("ninja")
    return "" if ninja is None else _version_of(ninja)  # none: torch refuses to build, and says so


@functools.cache  # a rank asks twice (train.main, then load_comm_op): run `ninja --version` once
def _version_of(ninja: str) -> str:
    try:
        return subprocess.run([ninja, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ninja


def layout_folder(layout: dict[str, str]) -> str:
    digest = hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()[:16]
    return f"{LAYOUT_PREFIX}{digest}"


def layout_build_root(layout: dict[str, str] | None = None) -> Path:
    """The folder this process's ops build in: its build layout's (`layout`, default this
    interpreter's) under torch's root (TORCH_EXTENSIONS_DIR as given, or torch's per-version
    default). An inherited layout folder (this process's parent called `use_layout_build_root`)
    counts as the root's, so layouts sit side by side, never inside one another."""
    from torch.utils.cpp_extension import _get_build_directory

    root = Path(_get_build_directory(COMM_OP_NAME, verbose=False)).parent
    if root.name.startswith(LAYOUT_PREFIX):
        root = root.parent
    return root / layout_folder(build_layout() if layout is None else layout)


def use_layout_build_root() -> Path:
    """Build and load every op of this process in `layout_build_root()`, and return it."""
    own = layout_build_root()
    os.environ[EXTENSIONS_ENV] = str(own)
    return own


def extensions_root() -> Path:
    """The directory holding one build directory per op, as torch lays it out: under
    TORCH_EXTENSIONS_DIR, or under the default root in a per-accelerator folder (`py311_cpu`)."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(COMM_OP_NAME, verbose=False)).parent


@contextlib.contextmanager
def exclusive_build(op_name: str, root: str | Path | None = None) -> Iterator[None]:
    """Hold the extensions root's flock; under it a FileBaton lock of `op_name` is a dead loader's."""
    root = extensions_root() if root is None else root
    Path(root).mkdir(parents=True, exist_ok=True)
    with open(Path(root) / FLOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released by the kernel if this process dies
        lock = Path(root) / op_name / "lock"
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
            log.warning("removed %s, left by a DeepSpeed op build or load that died", lock)
        yield


def load_comm_op() -> None:
    """Load (building it the first time) DeepSpeed's CPU communication op under the flock.

    Collective-free: `init_distributed` loads it before its rendezvous, so taking the flock
    around `init_distributed` itself would deadlock one rank against another. DeepSpeed keeps
    loaded ops, so init_distributed then finds this one without taking torch's lock again.
    """
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    use_layout_build_root()
    builder = get_accelerator().create_op_builder(COMM_OP)
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return  # not a CPU accelerator, or the op cannot build here: DeepSpeed goes without it
    with exclusive_build(builder.NAME):
        builder.load(verbose=False)
