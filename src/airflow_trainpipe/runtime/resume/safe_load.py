"""Loading from shared stores without unpickling: checkpoints and the champion's network.

Trust boundary: checkpoints and registered models live in shared stores (S3, a PVC, the MLflow
artifact store) that more principals can write than can run code in the training job. Python's
pickle runs code while it loads, so nothing read from those stores is unpickled:

- every `torch.load` of the job (ours and DeepSpeed's, which passes `weights_only=False`) is
  forced to torch's weights-only unpickler by `TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`, set for the
  whole process and its `ds_to_universal` child; only tensors, plain containers and the few
  DeepSpeed classes in `ALLOWED_GLOBALS` can come back;
- the champion is scored from its artifacts, the fitted transform JSON and the torch.export
  program, never by loading its pyfunc (the code it was logged with, or an older version's
  pickled `python_model.pkl`); a program archive that would unpickle anything (pickled tensor
  subclasses, custom or opaque objects) is refused.
"""

from __future__ import annotations

import importlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

FORCE_ENV = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"

# What DeepSpeed 0.19 puts into ZeRO optimizer shards besides tensors and containers (found by
# listing the GLOBAL opcodes of stage 1-3 and universal checkpoints): plain value classes.
ALLOWED_GLOBALS = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)


class UnsafeArtifactError(Exception):
    """An artifact from a shared store would need pickle to load."""


def enforce_weights_only() -> None:
    """Every later `torch.load` of this process (and of children that inherit the environment)
    uses the weights-only unpickler, with DeepSpeed's value classes allowed."""
    import torch

    os.environ[FORCE_ENV] = "1"
    torch.serialization.add_safe_globals([_resolve(name) for name in ALLOWED_GLOBALS])


def _resolve(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def load_exported_program(path: str | Path, device: Any = None) -> Any:
    """A torch.export program from an untrusted archive, as a callable module on `device` (None:
    where it was exported, the CPU; another device through torch's `move_to_device_pass`, which
    also moves the devices the program's graph names).

    torch.export.load unpickles pickled tensors, custom objects and opaque objects, and falls
    back to a full unpickle when weights-only fails; the archive's payload configs say which
    entries would be unpickled, so those archives are refused before loading.
    """
    import torch

    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if name.endswith(("_weights_config.json", "_constants_config.json")):
                _check_payload_config(path, name, json.loads(archive.read(name)))
    previous = os.environ.get(FORCE_ENV)
    os.environ[FORCE_ENV] = "1"
    try:
        program = torch.export.load(str(path))
        if device is not None and torch.device(device).type != "cpu":
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, torch.device(device))
        return program.module()
    finally:
        if previous is None:
            os.environ.pop(FORCE_ENV, None)
        else:
            os.environ[FORCE_ENV] = previous


def _check_payload_config(path: str | Path, name: str, config: dict[str, Any]) -> None:
    for fqn, meta in (config.get("config") or {}).items():
        file = str(meta.get("path_name", ""))
        if meta.get("use_pickle") or file.startswith(("custom_obj", "opaque_obj")):
            raise UnsafeArtifactError(
                f"{path}: {name} entry {fqn!r} ({file}) would be unpickled; refusing to load it"
            )


if __name__ == "__main__":
    # `python -m airflow_trainpipe.runtime.resume.safe_load MODULE ARGS...`: run a tool (DeepSpeed's
    # ds_to_universal) as `python -m MODULE ARGS...`, with weights-only loading enforced.
    import runpy
    import sys

    enforce_weights_only()
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
