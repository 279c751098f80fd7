"""`tuning`: an Optuna study over the hyperparameters, its trials Airflow mapped tasks.

Each trial trains with the pipeline's own entrypoint and launcher on the training rows minus a
validation split carved from them (never the gate's holdout), rung by rung: a successive-halving
pruner (Optuna's) stops the weak ones at the end of a rung, and a survivor continues from its own
checkpoint. The best trial is the gate's candidate.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, ValidationError, model_validator

from airflow_trainpipe.config.base import FieldProblems, Section
from airflow_trainpipe.config.catalog import METRICS
from airflow_trainpipe.config.model_args import ENCODER_SHAPE_ARGS, model_args_problems
from airflow_trainpipe.config.suggest import did_you_mean
from airflow_trainpipe.config.training import Hyperparameters, Scalar, TrainingSection
from airflow_trainpipe.config.types import PoolName

# Hyperparameters a search may vary; `model_args.<name>` may be varied too. The others are the
# study's own (epochs or max_steps are the pruner's resource, the seed is held fixed so trials
# differ by their hyperparameters only).
MODEL_ARGS_PREFIX = "model_args."


def hyperparameter_overrides(model_args: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Search-space values as `Hyperparameters.with_overrides` takes them: `model_args.<name>`
    entries merged into the current `model_args`, the rest as they are."""
    plain = {k: v for k, v in values.items() if not k.startswith(MODEL_ARGS_PREFIX)}
    args = {k[len(MODEL_ARGS_PREFIX) :]: v for k, v in values.items() if k.startswith(MODEL_ARGS_PREFIX)}
    return {**plain, **({"model_args": {**model_args, **args}} if args else {})}


TUNABLE = (
    "learning_rate",
    "weight_decay",
    "batch_size",
    "gradient_accumulation_steps",
    "warmup_steps",
    "warmup_ratio",
    "min_lr_ratio",
)


class FloatRange(Section):
    """A float drawn from [low, high], uniformly or on a log scale (Optuna `suggest_float`)."""

    type: Literal["float"]
    low: float
    """Smallest value (inclusive)."""
    high: float
    """Largest value (inclusive)."""
    log: bool = False
    """Draw on a log scale (learning rates, weight decay); needs low > 0."""
    step: PositiveFloat | None = None
    """Discretise to multiples of `step` from `low` (not with log)."""

    @model_validator(mode="after")
    def _valid_range(self) -> FloatRange:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low >= self.high:
            raise ValueError(f"low {self.low} must be below high {self.high} (both finite)")
        if self.log and self.low <= 0:
            raise ValueError(f"a log-scale range needs low > 0, got {self.low}")
        if self.log and self.step is not None:
            raise ValueError("step and log cannot be combined (Optuna refuses it)")
        return self


class IntRange(Section):
    """An integer drawn from [low, high] (Optuna `suggest_int`)."""

    type: Literal["int"]
    low: int
    """Smallest value (inclusive)."""
    high: int
    """Largest value (inclusive)."""
    log: bool = False
    """Draw on a log scale; needs low > 0 and step 1."""
    step: PositiveInt = 1
    """Only low, low + step, ... are drawn."""

    @model_validator(mode="after")
    def _valid_range(self) -> IntRange:
        if self.low >= self.high:
            raise ValueError(f"low {self.low} must be below high {self.high}")
        if self.log and (self.low <= 0 or self.step != 1):
            raise ValueError("a log-scale integer range needs low > 0 and step 1")
        return self


class Choice(Section):
    """One of `choices` (Optuna `suggest_categorical`); a choice may be a list, e.g. layer sizes."""

    type: Literal["categorical"]
    choices: list[Scalar | list[Scalar]] = Field(min_length=2)
    """The values to choose from (at least two)."""


SearchDimension = Annotated[FloatRange | IntRange | Choice, Field(discriminator="type")]


class Objective(Section):
    """What the study optimises on the validation split; default: the gate's metric and direction."""

    metric: str | None = None
    """A metric of the task, scored on the validation split; null: gate.metric."""
    direction: Literal["maximize", "minimize"] | None = None
    """null: the metric's own (roc_auc is maximized, log_loss minimized)."""


class SamplerSection(Section):
    """How trials pick hyperparameters (Optuna's samplers)."""

    kind: Literal["tpe", "random", "qmc"] = "tpe"
    """`tpe` (Bayesian, Tree-structured Parzen Estimator), `random`, or `qmc` (scrambled Sobol)."""
    seed: int = Field(default=0, ge=0)
    """The same seed and the same finished trials give the same next suggestion."""
    startup_trials: PositiveInt = 4
    """TPE: random trials before the model of good and bad regions is used."""


class PruningSection(Section):
    """Early stopping of weak trials at rung ends: successive halving or Hyperband (Optuna's pruners)."""

    kind: Literal["successive_halving", "hyperband", "none"] = "successive_halving"
    """`successive_halving` (asynchronous, Optuna's SuccessiveHalvingPruner), `hyperband` (several
    brackets of it), or `none`: every trial trains its full budget."""
    resource: Literal["epochs", "steps"] = "epochs"
    """What a rung is measured in: epochs, or optimizer steps (needs hyperparameters.max_steps)."""
    min_resource: PositiveInt = 1
    """The first rung: every trial trains this much before it can be stopped."""
    reduction_factor: int = Field(default=3, ge=2)
    """About 1 in `reduction_factor` trials continues past each rung."""


class BudgetSection(Section):
    """How much searching: the trials, their parallelism, a ceiling on device-hours."""

    trials: PositiveInt = 16
    """Trials in the study (mapped task instances of the `trial` task)."""
    max_parallel: PositiveInt = 2
    """Trials that train at the same time (`max_active_tis_per_dagrun`)."""
    max_compute_hours: PositiveFloat | None = None
    """Stop starting trials once the study has used this many device-hours (trials already
    running finish their rung)."""


class TuningSection(Section):
    """Hyperparameter search before the candidate is chosen; the trigger form can turn it off."""

    space: dict[str, SearchDimension] = Field(min_length=1)
    """Name -> range: a hyperparameter (learning_rate, weight_decay, batch_size,
    gradient_accumulation_steps, warmup_steps, warmup_ratio, min_lr_ratio) or `model_args.<name>`, e.g.
    `{learning_rate: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}}`."""

    objective: Objective = Objective()
    """What the study optimises; default: the gate's metric and direction."""
    sampler: SamplerSection = SamplerSection()
    """How trials pick their hyperparameters."""
    pruning: PruningSection = PruningSection()
    """When weak trials stop early."""
    budget: BudgetSection = BudgetSection()
    """How many trials, how many at a time, and a compute ceiling."""
    retrain: bool = False
    """false: the best trial's model is the candidate. true: train once more with the best
    hyperparameters, from scratch, as a plain run (the same training and validation rows)."""
    storage_conn_id: str | None = None
    """Airflow connection whose URI is the Optuna RDB storage (PostgreSQL in production);
    null: an SQLite file under TRAINPIPE_HOME/optuna. Required with `launcher: kubernetes` and
    pruning: a trial's pod reports its rungs to it."""
    nproc_per_trial: PositiveInt | None = None
    """Processes per trial; default training.resources.processes_per_node."""
    pool: PoolName | None = None
    """The Airflow pool each trial takes slots of (its ranks, or its GPUs in pods); null:
    the train task's pool, so trials and retrains of one host share its cores."""
    priority_weight: PositiveInt | None = None
    """Each trial's place in the queue for pool slots; null: `training.priority_weight`. An
    exploratory study set below the production retrains waits for them."""

    @model_validator(mode="before")
    @classmethod
    def _validation_fraction_moved(cls, values: Any) -> Any:
        if isinstance(values, dict) and "validation_fraction" in values:
            raise ValueError(
                "validation_fraction moved to data.validation.fraction: trials, epoch metrics, early "
                "stopping and the best epoch all read that one split (docs/data.md)"
            )
        return values

    def rungs(self, max_resource: int) -> list[int]:
        """The resource at the end of each rung: min_resource * reduction_factor**k, then the full budget."""
        p = self.pruning
        if p.kind == "none" or p.min_resource >= max_resource:
            return [max_resource]
        rungs, r = [], p.min_resource
        while r < max_resource:
            rungs.append(r)
            r *= p.reduction_factor
        return [*rungs, max_resource]

    def max_resource(self, hp: Hyperparameters) -> int:
        """A trial's full budget in the pruning resource: `hp`'s epochs, or its max_steps."""
        if self.pruning.resource == "steps":
            return hp.max_steps or 0  # the config requires max_steps with this resource
        return hp.epochs


def objective_problems(
    tuning: TuningSection | None, training: TrainingSection, gate_metric: str
) -> FieldProblems:
    """The study optimises a metric of the task, in its direction, over a resource the training has."""
    if tuning is None:
        return []
    problems: FieldProblems = []
    metrics, task, objective = METRICS[training.task], training.task, tuning.objective
    metric = objective.metric or gate_metric
    if objective.metric is not None and objective.metric not in metrics:
        problems.append(
            (
                ("tuning", "objective", "metric"),
                f"{objective.metric!r} is not a {task} metric"
                f"{did_you_mean(objective.metric, metrics)}; expected one of {', '.join(metrics)}",
            )
        )
    elif objective.direction and metric in metrics and objective.direction != metrics[metric]:
        # An unknown gate.metric is the gate's own problem (gate_metric_problems), said there.
        problems.append(
            (
                ("tuning", "objective", "direction"),
                f"{metric} is better when it is {'higher' if metrics[metric] == 'maximize' else 'lower'}",
            )
        )
    if tuning.pruning.resource == "steps" and training.hyperparameters.max_steps is None:
        problems.append(
            (
                ("tuning", "pruning", "resource"),
                "rungs in steps need training.hyperparameters.max_steps (a trial's full budget)",
            )
        )
    return problems


def search_space_problems(tuning: TuningSection | None, training: TrainingSection) -> FieldProblems:
    """Every name is tunable, and every bound and choice is a valid value of its hyperparameter
    (a built-in model's argument: one its builder takes, and a pretrained directory does not fix)."""
    if tuning is None:
        return []
    hp = training.hyperparameters
    problems: FieldProblems = []
    for name, dimension in tuning.space.items():
        where = ("tuning", "space", name)
        if not (
            name in TUNABLE or (name.startswith(MODEL_ARGS_PREFIX) and len(name) > len(MODEL_ARGS_PREFIX))
        ):
            problems.append(
                (
                    where,
                    f"{name!r} cannot be tuned{did_you_mean(name, TUNABLE)}; expected one of "
                    f"{', '.join(TUNABLE)} or model_args.<argument>",
                )
            )
            continue
        values = dimension.choices if dimension.type == "categorical" else [dimension.low, dimension.high]
        for value in values:
            try:
                tried = hp.with_overrides(hyperparameter_overrides(hp.model_args, {name: value}))
            except ValidationError as exc:
                problems.append((where, f"{value!r} is not a valid {name}: {exc.errors()[0]['msg']}"))
                break
            if refused := _model_arg_problem(training, tried.model_args, name):
                problems.append((where, refused))
                break
    return problems


def _model_arg_problem(training: TrainingSection, args: dict[str, Any], name: str) -> str | None:
    """Why the model would refuse a trial's `model_args` (`args`, with the search space's `name`
    set to one of its values); None: it would not."""
    if not name.startswith(MODEL_ARGS_PREFIX):
        return None
    argument = name.removeprefix(MODEL_ARGS_PREFIX)
    if training.pretrained is not None and argument in ENCODER_SHAPE_ARGS:
        # Each trial would train the directory's own shape and report the value as if it mattered.
        return (
            f"comes from the pretrained directory's config.json ({training.pretrained}): it cannot be tuned"
        )
    # Only what the value adds: a problem of the config's own model_args is reported there once,
    # not again under every dimension of the space.
    already = model_args_problems(training.model, training.hyperparameters.model_args, ())
    added = [
        message
        for path, message in model_args_problems(training.model, args, ())
        if (path, message) not in already
    ]
    return added[0] if added else None  # each names the value it refuses
