"""config.tuning: the search space, objective, sampler, pruner rungs and budget; located errors."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from airflow_trainpipe.config.loader import parse_config
from airflow_trainpipe.config.tuning import TuningSection
from airflow_trainpipe.core.exceptions import ConfigError
from tests.conftest import EXAMPLE_CONFIGS

TUNED = (EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml").read_text()


def _with_tuning(**changes: Any) -> str:
    config = yaml.safe_load(TUNED)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = config["tuning"]
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return yaml.safe_dump(config)


def _problems(text: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "tuned.yaml")
    return [(p.path, p.message) for p in caught.value.problems]


def test_the_example_tunes_the_gate_metric_with_successive_halving() -> None:
    config = parse_config(TUNED, "tuned.yaml")
    assert config.tuning is not None
    assert config.tuning_objective == ("roc_auc", "maximize")  # the gate's, by default
    assert config.tuning.budget.trials == 16 and config.tuning.pruning.kind == "successive_halving"
    assert config.tuning.rungs(config.tuning_max_resource) == [1, 3]  # 3 epochs, min 1, factor 3
    assert config.tuning.space["model_args.hidden_sizes"].choices == [[32], [64, 32], [128, 64]]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("min_resource", "factor", "full", "rungs"),
    [
        (1, 3, 27, [1, 3, 9, 27]),
        (1, 3, 10, [1, 3, 9, 10]),
        (2, 2, 9, [2, 4, 8, 9]),
        (5, 3, 5, [5]),
        (1, 2, 1, [1]),
    ],
)
def test_rungs_grow_by_the_reduction_factor_and_end_at_the_full_budget(
    min_resource: int, factor: int, full: int, rungs: list[int]
) -> None:
    section = TuningSection.model_validate(
        {
            "space": {"learning_rate": {"type": "float", "low": 0.001, "high": 0.1}},
            "pruning": {"min_resource": min_resource, "reduction_factor": factor},
        }
    )
    assert section.rungs(full) == rungs


def test_no_pruning_trains_every_trial_to_the_full_budget() -> None:
    config = parse_config(_with_tuning(pruning__kind="none"), "tuned.yaml")
    assert config.tuning is not None and config.tuning.rungs(3) == [3]


def test_an_unknown_hyperparameter_is_named_with_a_suggestion() -> None:
    space = {"learning_rte": {"type": "float", "low": 0.001, "high": 0.1}}
    [(path, message)] = _problems(_with_tuning(space=space))
    assert path == "tuning.space.learning_rte"
    assert "did you mean 'learning_rate'" in message and "model_args.<argument>" in message


def test_the_seed_and_the_budget_itself_cannot_be_tuned() -> None:
    for name in ("seed", "epochs", "max_steps"):
        [(path, message)] = _problems(_with_tuning(space={name: {"type": "int", "low": 1, "high": 5}}))
        assert path == f"tuning.space.{name}" and "cannot be tuned" in message


def test_bounds_and_choices_must_be_valid_values_of_their_hyperparameter() -> None:
    space = {"learning_rate": {"type": "float", "low": 0.0, "high": 0.1}}
    [(path, message)] = _problems(_with_tuning(space=space))
    assert path == "tuning.space.learning_rate" and "0.0 is not a valid learning_rate" in message
    [(path, message)] = _problems(
        _with_tuning(space={"batch_size": {"type": "categorical", "choices": [64, 0]}})
    )
    assert path == "tuning.space.batch_size" and "0 is not a valid batch_size" in message


def test_a_model_argument_problem_of_the_config_is_reported_once_where_it_is_written() -> None:
    """A misspelt model_args key was reported again under every model_args dimension of the
    space, as if the dimension's values were wrong."""
    text = TUNED.replace(
        "model_args: {hidden_sizes: [64, 32], dropout: 0.1}",
        "model_args: {hidden_size: [64, 32], dropout: 0.1}",
    )
    assert text != TUNED
    problems = _problems(text)
    assert [path for path, _ in problems] == ["training.hyperparameters.model_args.hidden_size"], problems


def test_ranges_are_checked_where_they_are_written() -> None:
    [(path, message)] = _problems(
        _with_tuning(space={"learning_rate": {"type": "float", "low": 0.1, "high": 0.01}})
    )
    assert path == "tuning.space.learning_rate.float" and "must be below high" in message
    [(path, message)] = _problems(
        _with_tuning(space={"weight_decay": {"type": "float", "low": 0.0, "high": 0.1, "log": True}})
    )
    assert "log-scale range needs low > 0" in message
    [(path, message)] = _problems(
        _with_tuning(space={"batch_size": {"type": "categorical", "choices": [64]}})
    )
    assert path == "tuning.space.batch_size.categorical.choices" and "at least 2" in message


def test_the_objective_must_be_a_metric_of_the_task_in_its_direction() -> None:
    [(path, message)] = _problems(_with_tuning(objective={"metric": "rmse"}))
    assert path == "tuning.objective.metric" and "not a binary_classification metric" in message
    [(path, message)] = _problems(_with_tuning(objective={"metric": "log_loss", "direction": "maximize"}))
    assert path == "tuning.objective.direction" and "better when it is lower" in message
    config = parse_config(_with_tuning(objective={"metric": "log_loss"}), "tuned.yaml")
    assert config.tuning_objective == ("log_loss", "minimize")


def test_a_direction_beside_an_unknown_gate_metric_is_the_gates_located_error_not_a_crash() -> None:
    # The objective defaults to the gate's metric: when that is not a metric of the task, the gate
    # says so (located), and the direction is not checked against a metric that does not exist.
    text = _with_tuning(objective={"direction": "maximize"}).replace("metric: roc_auc", "metric: rocauc", 1)
    assert "metric: rocauc" in text
    problems = _problems(text)
    assert [path for path, _ in problems] == ["gate.metric"], problems


def test_rungs_in_steps_need_a_step_budget() -> None:
    [(path, message)] = _problems(_with_tuning(pruning={"resource": "steps", "min_resource": 10}))
    assert path == "tuning.pruning.resource" and "max_steps" in message
    text = _with_tuning(pruning={"resource": "steps", "min_resource": 10}).replace(
        "    epochs: 3\n", "    epochs: 3\n    max_steps: 90\n"
    )
    config = parse_config(text, "tuned.yaml")
    assert config.tuning is not None and config.tuning.rungs(config.tuning_max_resource) == [10, 30, 90]


def test_trials_are_scored_on_the_pipelines_validation_split() -> None:
    [(path, message)] = _problems(_with_tuning(validation_fraction=0.2))
    assert path == "tuning" and "moved to data.validation.fraction" in message
    config = yaml.safe_load(TUNED)
    config["data"]["validation"] = None
    [(path, message)] = _problems(yaml.safe_dump(config))
    assert path == "data.validation" and "tuning trials are scored on the validation split" in message
    split = parse_config(TUNED).data.validation_split()
    assert split is not None and split.fraction == 0.1
