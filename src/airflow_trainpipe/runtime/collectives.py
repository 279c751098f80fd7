"""The process groups a training job's own collectives run on, and a check of that rule on CPU.

The default process group belongs to DeepSpeed's training traffic: nccl on a GPU node, and nccl
carries device tensors only. A host tensor sent to it fails with "No backend type associated with
device type cpu"; every GPU job died that way at its first sync before the rule below existed,
while every CPU test passed, because on CPU the default group is gloo and takes anything.

The rule: every collective the runtime makes itself moves host data (the losses and flags of the
periodic sync, the metrics' sums and counts, the rows of a chunk, objects), so it goes to the
*host group*, a gloo group beside the training one on a GPU node (the default group on a CPU job,
which is gloo already). DeepSpeed's own collectives stay on the default group.

`TRAINPIPE_CHECK_COLLECTIVES=nccl` makes a CPU job keep that rule as a GPU node would enforce it:
the host group is created apart from the default group, as on a GPU, and a tensor collective that
the runtime itself sends to the default group with a host tensor raises nccl's error, naming the
call. The test suite runs every training job that way (tests/conftest.py), so a GPU-only crash of
this kind fails on CPU in CI. Unset in production, where it costs one environment lookup.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

CHECK_ENV = "TRAINPIPE_CHECK_COLLECTIVES"
# What torch says at a barrier on an NCCL group that has no device bound to it.
UNBOUND_BARRIER = r"barrier\(\): using the device under current context"
# What torch 2.13 says of the collective DeepSpeed's ZeRO gathers its updated partitions with.
DEPRECATED_GATHER = r"`torch\.distributed\.all_gather_into_tensor` is deprecated"
PACKAGE = "airflow_trainpipe."

# The tensor collectives a process group refuses host tensors for when its backend is nccl; the
# object collectives and barrier serialise onto the current device themselves.
_TENSOR_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "reduce_scatter_tensor",
    "all_to_all_single",
)


def checking() -> bool:
    """Whether this job emulates a GPU node's default group (TRAINPIPE_CHECK_COLLECTIVES=nccl)."""
    return os.environ.get(CHECK_ENV) == "nccl"


def host_group(on_gpu: bool) -> Any:
    """Collective: the gloo group for host data. None (the default group) on a CPU job, unless its
    collectives are being checked, which needs the two apart as on a GPU node."""
    if on_gpu or checking():
        return dist.new_group(backend="gloo")
    return None


def quiet_unbound_barrier(on_gpu: bool, world_size: int) -> None:
    """Silence torch's "using the device under current context" at DeepSpeed's barriers on a
    one-rank GPU job, and there only.

    With more than one rank DeepSpeed binds each rank's device to the NCCL group
    (`init_process_group(device_id=...)`), and torch has nothing to say. With one rank it does
    not, on purpose: the eager NCCL set-up that binding starts failed with CUDA error 600 on some
    drivers (deepspeedai/DeepSpeed#8248). Torch then warns at each of DeepSpeed's barriers that
    it uses the device under the current context, which is the rank's own, set before the group
    was made (JobSetup): the one case where the warning always shows is the one where it is
    always wrong."""
    if on_gpu and world_size == 1:
        warnings.filterwarnings("ignore", message=UNBOUND_BARRIER, category=UserWarning)


def quiet_deepspeed_gather_deprecation() -> None:
    """Silence torch's FutureWarning that `all_gather_into_tensor` is deprecated.

    DeepSpeed calls it, not the runtime, and nothing in a pipeline's config changes that. Torch
    warns once per place, but any change to the warning filters (a `catch_warnings` in a library
    the job runs) forgets what was shown, so each rank printed it again after every checkpoint:
    8 times in each task log of `make demo`."""
    warnings.filterwarnings("ignore", message=DEPRECATED_GATHER, category=FutureWarning)


@contextmanager
def checked() -> Iterator[None]:
    """Under TRAINPIPE_CHECK_COLLECTIVES=nccl, torch.distributed's tensor collectives refuse a host
    tensor that the runtime sends to the default group, as nccl does; put back on the way out (a
    job in pytest's own process leaves the functions as it found them)."""
    if not checking():
        yield
        return
    originals = {name: getattr(dist, name) for name in _TENSOR_COLLECTIVES if hasattr(dist, name)}
    for name, collective in originals.items():
        setattr(dist, name, _checked(name, collective))
    try:
        yield
    finally:
        for name, collective in originals.items():
            setattr(dist, name, collective)


def _checked(name: str, collective: Any) -> Any:
    signature = inspect.signature(collective)

    @functools.wraps(collective)
    def call(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1)
        module = caller.f_globals.get("__name__", "")
        bound = signature.bind_partial(*args, **kwargs).arguments
        group = bound.get("group")
        if module.startswith(PACKAGE) and (group is None or group is dist.GroupMember.WORLD):
            host = [t for t in _tensors(bound.values()) if t.device.type == "cpu"]
            if host:
                raise RuntimeError(
                    f"No backend type associated with device type cpu: {name}() of a host tensor "
                    f"on the default process group, which is nccl on a GPU node "
                    f"({module}:{caller.f_lineno}; {CHECK_ENV}=nccl). Send host data to the host group."
                )
        return collective(*args, **kwargs)

    return call


def _tensors(values: Iterable[Any]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, list | tuple):
            found += [v for v in value if isinstance(v, torch.Tensor)]
    return found
