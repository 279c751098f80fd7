"""What the warm parent does once after its imports, so that no job forked from it does it again.

Imported by the warm parent alone (the last name of launchers/forked.py's PRELOAD): importing it is
the work. Each step is work every forked job paid on its own, measured on a one-rank job of the
test config (tests/helpers/jobs.py):

- MLflow maps every installed distribution to its modules the first time a process logs a model
  with pinned requirements (it checks them against what is installed), reading each one's RECORD:
  0.3-0.5 s of each job's end.
- torchrun's rendezvous names each event it records after the method that recorded it, found by
  `inspect.stack()`, which reads the source of every frame and looks every module of the process
  up: with torch, DeepSpeed and MLflow imported, ~20 ms a walk, two walks for each of the nine
  events of a one-node rendezvous.
"""

from __future__ import annotations

import sys


def _name_rendezvous_events_by_frame() -> None:
    """torch's `get_method_name` with the frame's own code name: the same name (a frame's
    `inspect.stack()` entry is named after its code object), without reading any source."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    def get_method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:  # fewer frames than `depth`, as torch answers then
            return "no_method_name"

    dynamic_rendezvous.get_method_name = get_method_name


def _map_installed_distributions() -> None:
    from mlflow.utils.requirements_utils import _init_packages_to_modules_map

    _init_packages_to_modules_map()


def _prepare() -> None:
    # Each step only saves time. A torch or MLflow without what a step uses must not stop the warm
    # parent, whose imports would then fail every forked job: the jobs run as before, slower, and
    # tests/launchers/test_warm_parent_setup.py fails instead.
    for step in (_name_rendezvous_events_by_frame, _map_installed_distributions):
        try:
            step()
        except Exception as exc:
            print(f"trainpipe: the warm parent skipped {step.__name__}: {exc!r}", file=sys.stderr)


_prepare()
