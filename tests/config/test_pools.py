"""config.pools: which pool the train task and each trial take slots of, how many, in what order."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.config.pools import pool_claims, training_claim, trial_claim
from airflow_trainpipe.core.exceptions import ConfigError
from tests.conftest import EXAMPLE_CONFIGS


def _config(name: str = "fraud_detector.yaml", **training: Any):
    data = yaml.safe_load((EXAMPLE_CONFIGS / name).read_text())
    data["training"].update(training)
    return parse_config(yaml.safe_dump(data), name)


def test_a_local_job_takes_a_slot_per_rank_of_the_training_pool() -> None:
    claim = training_claim(_config(resources={"processes_per_node": 3}))
    assert (claim.task_id, claim.pool, claim.slots, claim.priority_weight) == (
        "train",
        "trainpipe_training",
        3,
        1,
    )
    assert claim.task_arguments() == {
        "pool": "trainpipe_training",
        "pool_slots": 3,
        "priority_weight": 1,
        "weight_rule": "absolute",
    }


def test_pods_take_a_slot_per_gpu_of_their_own_pool() -> None:
    config = _config("house_prices.yaml")  # 2 nodes x 4 GPUs
    assert (config.training.launcher, config.training.resources.nodes) == ("kubernetes", 2)
    claim = training_claim(config)
    assert (claim.pool, claim.slots) == ("trainpipe_kubernetes", 8)
    cpu_pods = _config(
        "house_prices.yaml", resources={"nodes": 2, "gpus_per_node": 0}, deepspeed={"precision": "fp32"}
    )
    assert training_claim(cpu_pods).slots == 1  # a CPU-only job still takes its turn


def test_a_named_pool_and_priority_reach_the_claim() -> None:
    claim = training_claim(_config(pool="nightly_gpus", priority_weight=10))
    assert (claim.pool, claim.priority_weight) == ("nightly_gpus", 10)


def test_trials_share_the_train_pool_unless_tuning_names_its_own() -> None:
    tuned = _config("fraud_detector_tuned.yaml", priority_weight=5)
    assert tuned.tuning is not None
    trial = trial_claim(tuned)
    assert trial is not None
    nproc = tuned.tuning.nproc_per_trial or tuned.training.resources.nproc_per_node
    assert (trial.task_id, trial.pool, trial.slots, trial.priority_weight) == (
        "trial", "trainpipe_training", nproc, 5,
    )  # fmt: skip
    data = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml").read_text())
    data["tuning"].update(pool="studies", priority_weight=1, nproc_per_trial=2)
    own = trial_claim(parse_config(yaml.safe_dump(data), "tuned.yaml"))
    assert own is not None and (own.pool, own.slots, own.priority_weight) == ("studies", 2, 1)
    assert [c.task_id for c in pool_claims(tuned)] == ["train", "trial"]
    assert trial_claim(_config()) is None and [c.task_id for c in pool_claims(_config())] == ["train"]


@pytest.mark.parametrize(
    ("section", "values", "where"),
    [
        ("training", {"pool": "no spaces"}, "training.pool"),
        ("training", {"pool": ""}, "training.pool"),
        ("training", {"priority_weight": 0}, "training.priority_weight"),
    ],
)
def test_a_bad_pool_or_weight_is_located(section: str, values: dict[str, Any], where: str) -> None:
    data = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text())
    data[section].update(values)
    with pytest.raises(ConfigError) as caught:
        parse_config(yaml.safe_dump(data), "fraud.yaml")
    assert where in str(caught.value)
