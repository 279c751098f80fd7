"""What a pipeline's training tasks take of Airflow pools: the train task's claim, and each trial's.

Airflow's scheduler starts a task only when its pool has `pool_slots` open, the waiting tasks
ordered by `priority_weight`; a training job's slots are its ranks (or its GPUs in pods), so a
pool sized to a worker host's cores keeps that host from running more ranks than it has cores.
Validation, the gate and registration stay in Airflow's `default_pool`: they are light, and
holding them behind training would only delay what is already trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_trainpipe.config.pipeline import PipelineConfig


@dataclass(frozen=True)
class PoolClaim:
    """One task's pool, its slots, its queue priority."""

    task_id: str
    pool: str
    slots: int
    priority_weight: int

    def task_arguments(self) -> dict[str, Any]:
        # `absolute`: the weight is the config's number. Airflow's default (`downstream`) would add
        # the weights of the tasks after train, so a pipeline with a canary would outrank one
        # without it for no reason its owner chose.
        return {
            "pool": self.pool,
            "pool_slots": self.slots,
            "priority_weight": self.priority_weight,
            "weight_rule": "absolute",
        }


def training_claim(config: PipelineConfig) -> PoolClaim:
    t = config.training
    return PoolClaim("train", t.pool_name, t.pool_slots, t.priority_weight)


def trial_claim(config: PipelineConfig) -> PoolClaim | None:
    """Each trial's claim (the mapped `trial` task); None without tuning."""
    tuning, t = config.tuning, config.training
    if tuning is None:
        return None
    return PoolClaim(
        "trial",
        tuning.pool or t.pool_name,
        t.slots_for(config.trial_nproc_per_node),
        tuning.priority_weight or t.priority_weight,
    )


def pool_claims(config: PipelineConfig) -> list[PoolClaim]:
    """Every claim of the pipeline's DAG: train, and with tuning its trials."""
    trial = trial_claim(config)
    return [training_claim(config), *([trial] if trial is not None else [])]
