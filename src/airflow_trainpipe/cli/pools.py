"""`trainpipe pools`: the Airflow pools the pipelines' training tasks take slots of, sized, and
with `--apply` created or grown in Airflow's metadata database (docs/operations.md). Reading the
configs needs no Airflow; `--apply` imports it."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from airflow_trainpipe.cli.common import config_files

if TYPE_CHECKING:
    from airflow_trainpipe.config import PipelineConfig


@dataclass
class PoolNeed:
    """What the configs ask of one pool: the largest job (a smaller pool never starts it), and
    whether any job runs its ranks beside the worker (then the host's cores size the pool)."""

    largest: int = 0
    total: int = 0
    local: bool = False
    users: list[str] = field(default_factory=list)

    def slots(self, cores: int) -> int:
        # Local ranks: one per core, so a host never runs more ranks than cores. Pods only: every
        # job at once, Kueue (training.kubernetes.queue) decides what the cluster admits.
        return max(self.largest, cores) if self.local else self.total

    @property
    def description(self) -> str:
        unit = "rank of a local training job" if self.local else "GPU of a training pod"
        return f"trainpipe: one slot per {unit} (trainpipe pools)"


def pool_needs(configs: Iterable[PipelineConfig]) -> dict[str, PoolNeed]:
    from airflow_trainpipe.config.pools import pool_claims

    needs: dict[str, PoolNeed] = {}
    for config in configs:
        for claim in pool_claims(config):
            need = needs.setdefault(claim.pool, PoolNeed())
            need.largest = max(need.largest, claim.slots)
            need.total += claim.slots
            need.local |= config.training.launcher == "local"
            need.users.append(f"{config.pipeline}.{claim.task_id}")
    return needs


def _load(paths: list[str]) -> list[PipelineConfig]:
    """The configs that load. A broken one is reported and skipped, as the DAG processor skips it
    (its stand-in DAG has no train task): `trainpipe check` is the command that fails on it."""
    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.core.exceptions import ConfigError

    configs = []
    for path in config_files(paths):
        try:
            configs.append(load_config(path))
        except ConfigError as exc:
            print(f"skipped, it does not load (trainpipe check):\n{exc}", file=sys.stderr)
    return configs


def apply(needs: dict[str, PoolNeed], slots: dict[str, int], *, resize: bool) -> list[str]:
    """Create each missing pool with `slots[name]`, grow one too small for its largest job, and
    keep the others as their operator sized them (`resize`: set every one to `slots`, --slots).
    Returns a line per pool saying which."""
    from airflow.models.pool import Pool

    done = []
    for name, need in sorted(needs.items()):
        existing, wanted = Pool.get_pool(name), slots[name]
        if existing is not None and existing.slots >= need.largest and not resize:
            done.append(f"{name}: kept at {existing.slots} slot(s) (largest job {need.largest})")
            continue
        # include_deferred: a job waiting in the triggerer still holds its ranks or GPUs.
        Pool.create_or_update_pool(name, wanted, need.description, include_deferred=True)
        before = "created" if existing is None else f"resized from {existing.slots}"
        done.append(f"{name}: {before} to {wanted} slot(s) (largest job {need.largest})")
    return done


def _pools(args: argparse.Namespace) -> int:
    needs = pool_needs(_load(args.paths))
    cores = len(os.sched_getaffinity(0))
    slots = {name: args.slots or need.slots(cores) for name, need in needs.items()}
    small = [name for name, need in needs.items() if slots[name] < need.largest]
    for name in small:
        print(
            f"{name}: --slots {slots[name]} is below its largest job ({needs[name].largest} slots), "
            "which would never start",
            file=sys.stderr,
        )
    if small:
        return 1
    for name, need in sorted(needs.items()):
        print(f"{name}: {slots[name]} slot(s), largest job {need.largest}: {', '.join(need.users)}")
    if args.apply:
        for line in apply(needs, slots, resize=args.slots is not None):
            print(line)
    else:
        for name in sorted(needs):
            print(f"airflow pools set {name} {slots[name]} '{needs[name].description}' --include-deferred")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pools = commands.add_parser(
        "pools",
        help="the Airflow pools the configs' training tasks take slots of; --apply creates them",
        description=__doc__.split("\n\n")[0].replace("\n", " "),
    )
    pools.add_argument(
        "paths", nargs="+", metavar="PATH", help="a config file or a folder searched for *.yaml/*.yml"
    )
    pools.add_argument(
        "--slots",
        type=int,
        help="every pool's size (default: the host's cores for local jobs, every job at once for pods)",
    )
    pools.add_argument(
        "--apply",
        action="store_true",
        help="create missing pools and grow ones below their largest job in Airflow's metadata "
        "database (AIRFLOW_HOME's); without it, print the `airflow pools set` commands",
    )
    pools.set_defaults(handler=_pools)
