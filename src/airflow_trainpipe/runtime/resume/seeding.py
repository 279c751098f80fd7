"""Seeds and generator states: a same-world-size resume continues every random stream exactly.

States are kept as tensors and plain numbers: checkpoints load weights-only
(runtime/resume/safe_load.py), which refuses numpy arrays and other pickled objects.
"""

from __future__ import annotations

import random
import typing
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's generator states: torch (and CUDA), numpy, Python."""
    name, keys, position, has_gauss, cached = typing.cast(
        tuple[str, np.ndarray, int, int, float], np.random.get_state(legacy=True)
    )
    version, python_state, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {
            "version": version,
            "state": torch.tensor(python_state, dtype=torch.int64),
            "gauss": gauss,
        },
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    saved = state["numpy"]
    np.random.set_state(
        (
            saved["name"],
            saved["keys"].numpy().astype(np.uint32),
            saved["pos"],
            saved["has_gauss"],
            saved["cached_gaussian"],
        )
    )
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss"]))
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
