"""Nothing from a shared store is unpickled: checkpoints load weights-only, networks without pickle."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from airflow_trainpipe.runtime.resume.safe_load import UnsafeArtifactError, load_exported_program

PAYLOAD = """
import pathlib, sys, torch

class Payload:
    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(sys.argv[2]),))

torch.save({"weights": torch.ones(2), "client_state": Payload()}, sys.argv[1])
"""

LOAD_LIKE_DEEPSPEED = """
import sys, torch
from airflow_trainpipe.runtime.resume.safe_load import enforce_weights_only

enforce_weights_only()
try:
    torch.load(sys.argv[1], weights_only=False)  # what DeepSpeed's checkpoint engine passes
except Exception as exc:
    print("REFUSED", type(exc).__name__, str(exc).splitlines()[0])
"""


def _python(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_pickled_object_in_a_checkpoint_is_refused_even_when_the_loader_asks_for_pickle(
    tmp_path: Path,
) -> None:
    checkpoint, proof = tmp_path / "mp_rank_00_model_states.pt", tmp_path / "ran"
    _python(PAYLOAD, str(checkpoint), str(proof))
    output = _python(LOAD_LIKE_DEEPSPEED, str(checkpoint))
    assert "REFUSED UnpicklingError" in output and not proof.exists()
    # Without the guard the same call runs the payload: the test can fail.
    _python("import sys, torch; torch.load(sys.argv[1], weights_only=False)", str(checkpoint))
    assert proof.exists()


def test_rng_state_survives_a_weights_only_round_trip(tmp_path: Path) -> None:
    import random

    import numpy as np

    from airflow_trainpipe.runtime.resume.seeding import restore_rng_state as _set_rng_state
    from airflow_trainpipe.runtime.resume.seeding import rng_state as _rng_state

    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    torch.save({"rng": [_rng_state()]}, tmp_path / "state.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    _set_rng_state(loaded["rng"][0])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def _exported(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).eval()
    program = torch.export.export(
        model, (torch.zeros(2, 3),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    path = tmp_path / "network.pt2"
    torch.export.save(program, str(path))
    return path


def _rewrite_config(path: Path, suffix: str, change) -> None:
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    (name,) = [n for n in entries if n.endswith(suffix)]
    config = json.loads(entries[name])
    change(config)
    entries[name] = json.dumps(config).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for entry, data in entries.items():
            archive.writestr(entry, data)


def test_an_exported_network_loads_without_pickle(tmp_path: Path) -> None:
    network = load_exported_program(_exported(tmp_path))
    assert network(torch.ones(5, 3)).shape == (5, 1)


@pytest.mark.parametrize("tamper", ["pickled_weight", "opaque_constant"])
def test_a_network_archive_that_would_unpickle_is_refused(tmp_path: Path, tamper: str) -> None:
    path = _exported(tmp_path)
    if tamper == "pickled_weight":

        def change(config):
            next(iter(config["config"].values()))["use_pickle"] = True

        _rewrite_config(path, "_weights_config.json", change)
    else:

        def change(config):
            config.setdefault("config", {})["evil"] = {"path_name": "opaque_obj_0", "use_pickle": False}

        _rewrite_config(path, "_constants_config.json", change)
    with pytest.raises(UnsafeArtifactError, match="would be unpickled; refusing to load it"):
        load_exported_program(path)
