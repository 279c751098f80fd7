"""The work the warm parent does once for every job forked from it (launchers/warm_parent_setup.py)
changes no answer: torchrun's rendezvous events keep their names, and MLflow's requirement check
reads the map of installed distributions it would have made itself. Checked in an interpreter of
its own: importing the module is the work, which this process must not have done to itself."""

from __future__ import annotations

import json
import subprocess
import sys

from airflow_trainpipe.launchers.forked import PRELOAD

SETUP = "airflow_trainpipe.launchers.warm_parent_setup"

_CHECK = f"""
import json
from importlib.metadata import version
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
from mlflow.utils import requirements_utils

torchs = dynamic_rendezvous.get_method_name
before = requirements_utils._PACKAGES_TO_MODULES
import {SETUP}
ours = dynamic_rendezvous.get_method_name

class Handler:  # as torch's handlers call it: from the `_record` of the method it names
    def _record(self, name_of, depth=2):
        return name_of(depth)

    def next_rendezvous(self, name_of, depth=2):
        return self._record(name_of, depth)

mapped = requirements_utils._PACKAGES_TO_MODULES
print(json.dumps({{
    "replaced": ours is not torchs,
    "names": [[Handler().next_rendezvous(f, depth) for f in (ours, torchs)] for depth in (0, 1, 2, 3, 10_000)],
    "mapped_before": before is not None,
    "mapped": {{name: (mapped or {{}}).get(name) for name in ("torch", "airflow-trainpipe")}},
    "torch_pin_mismatch": str(requirements_utils._check_requirement_satisfied(f"torch=={{version('torch')}}")),
}}))
"""


def test_the_warm_parent_does_it_after_every_import() -> None:
    assert PRELOAD[-1] == SETUP


def test_it_changes_no_answer_torch_or_mlflow_would_give() -> None:
    done = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["replaced"]
    names = found["names"]
    assert all(ours == torchs for ours, torchs in names), names
    assert names[2][0] == "next_rendezvous" and names[-1][0] == "no_method_name", names
    # Made once in the warm parent, not on a job's first log_model, and the same map.
    assert not found["mapped_before"]
    assert found["mapped"]["airflow-trainpipe"] == "airflow_trainpipe"
    assert found["mapped"]["torch"] in ("torch", "torchgen"), found["mapped"]  # a module of torch's
    assert found["torch_pin_mismatch"] == "None"


def test_a_step_that_no_longer_applies_is_skipped_and_says_so() -> None:
    """A step only saves time: the warm parent's imports still end (a failure there would fail
    every forked job), the other steps still run, and the skip is on stderr."""
    check = f"""
from mlflow.utils import requirements_utils
from torch.distributed.elastic.rendezvous import dynamic_rendezvous
torchs = dynamic_rendezvous.get_method_name
del requirements_utils._init_packages_to_modules_map  # as an MLflow without it would be
import {SETUP}
print(dynamic_rendezvous.get_method_name is not torchs)
"""
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "True"
    assert "trainpipe: the warm parent skipped _map_installed_distributions: ImportError(" in done.stderr
