"""`data`: where each run's snapshot comes from and which columns the model sees."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from airflow_trainpipe.config.base import FieldProblems, Section, field_problems
from airflow_trainpipe.config.catalog import Task
from airflow_trainpipe.config.feature_store import FeatureStoreSection
from airflow_trainpipe.config.sources import (
    DeltaSource,
    FilesSource,
    IcebergSource,
    SnapshotsSection,
    SqlSource,
)
from airflow_trainpipe.config.templates import renders_one_path, template_syntax_error
from airflow_trainpipe.config.training import TrainingSection, pod_storage_problems
from airflow_trainpipe.config.tuning import TuningSection
from airflow_trainpipe.config.types import ColumnName, PositiveDuration, StorageUri

# Sources exported into the snapshot store: rows, not files, so no marker file and always Parquet.
_FROZEN_KINDS = ("sql", "delta", "iceberg")


class FeatureColumns(Section):
    """Model inputs by kind; the kind decides encoding and which drift test applies."""

    numeric: list[ColumnName] = []
    """Numeric feature columns."""

    categorical: list[ColumnName] = []
    """Categorical feature columns (strings or integer codes)."""

    text: list[ColumnName] = []
    """Text columns (strings), tokenized as `features.text` declares: inputs of a text model
    (`training.model: text_encoder`, or a plugin that reads text)."""

    @model_validator(mode="after")
    def _distinct(self) -> FeatureColumns:
        if not self.numeric and not self.categorical and not self.text:
            raise ValueError("declare at least one feature column under `numeric`, `categorical` or `text`")
        problems: FieldProblems = []
        seen: set[str] = set()
        for kind, names in (
            ("numeric", self.numeric),
            ("categorical", self.categorical),
            ("text", self.text),
        ):
            for i, name in enumerate(names):
                if name in seen:
                    problems.append(((kind, i), f"column {name!r} is declared twice"))
                seen.add(name)
        field_problems(problems)
        return self

    @property
    def all(self) -> list[str]:
        return [*self.numeric, *self.categorical, *self.text]


class HoldoutSection(Section):
    """How the snapshot is split into training rows and the holdout every model is scored on."""

    fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    """Share of rows held out (between 0 and 1, exclusive)."""

    seed: int = Field(default=0, ge=0)
    """Seed of the split; the same snapshot and seed always give the same holdout."""

    key_column: ColumnName | None = None
    """Split by a hash of this column instead of by row, so a key never lands on both sides."""


class ValidationSplit(Section):
    """Rows carved out of the training rows and scored during training: a seeded share of them,
    split by the holdout's key (the gate's holdout is neither trained on nor scored by them)."""

    fraction: float = Field(gt=0.0, lt=1.0)
    seed: int = Field(ge=0)


class ValidationSection(Section):
    """The validation split: what epoch metrics, early stopping, the best epoch and tuning trials
    are scored on, so the holdout that then judges the candidate against the champion was never
    used to choose it."""

    fraction: float = Field(default=0.1, gt=0.0, lt=1.0)
    """Share of the training rows (after the holdout is taken) set aside for validation."""

    seed: int | None = Field(default=None, ge=0)
    """Seed of the split; null: `holdout.seed`. Drawn independently of the holdout's draw."""


class WaitSection(Section):
    """When `wait_for_data` considers a partition complete, and how it waits."""

    marker: str | None = "_SUCCESS"
    """File inside the partition the writer creates last (Spark/Hive `_SUCCESS`); null: not required."""

    min_rows: PositiveInt | None = None
    """Also (or instead) wait until the partition's files hold this many rows (read from file footers)."""

    mode: Literal["poke", "reschedule", "deferrable"] = "deferrable"
    """`deferrable` waits in the triggerer (no worker slot); `reschedule` frees the slot between checks;
    `poke` holds a worker slot."""

    poke_interval: PositiveDuration = timedelta(minutes=5)
    """Time between checks."""

    timeout: PositiveDuration = timedelta(hours=12)
    """Give up (the task fails) when the partition is not complete after this long."""

    @model_validator(mode="after")
    def _some_completion_rule(self) -> WaitSection:
        if self.marker is None and self.min_rows is None:
            raise ValueError(
                "set `marker`, `min_rows` or both: otherwise an empty partition would count as complete"
            )
        if self.marker is not None and (
            self.marker in ("", ".", "..") or "/" in self.marker or "\\" in self.marker
        ):
            field_problems([(("marker",), f"expected a file name inside the partition, got {self.marker!r}")])
        return self


class WindowSection(Section):
    """Train on the last `partitions` partitions ending at the run's, not on the run's alone."""

    partitions: int = Field(ge=1, le=3660)
    """Partitions in the window, the run's included: 30 with a daily `partition` is 30 days."""

    every: PositiveDuration = timedelta(days=1)
    """Time between two partitions: each earlier one is `data.partition` rendered with the run's
    dates (`ds`, `logical_date`, `data_interval_*`, a dated `partition_key`) moved back this much."""

    min_partitions: PositiveInt | None = None
    """Partitions that must exist for the run to train (the run's own always must); default: all.
    A run short of it fails naming the missing partitions. A `files` source's: a `sql`, `delta` or
    `iceberg` source reads the window's rows at once, whatever partitions they fall in."""

    @model_validator(mode="after")
    def _minimum_fits(self) -> WindowSection:
        if self.min_partitions is not None and self.min_partitions > self.partitions:
            field_problems(
                [
                    (
                        ("min_partitions",),
                        f"{self.min_partitions} is more than the window's {self.partitions} partition(s)",
                    )
                ]
            )
        return self

    @property
    def required(self) -> int:
        return self.partitions if self.min_partitions is None else self.min_partitions


class DataSection(Section):
    """The data a run trains on: `<uri>/<partition>/` holds one snapshot."""

    uri: StorageUri
    """Dataset root: `s3://bucket/prefix`, `file:///abs/path`, or a path relative to TRAINPIPE_HOME.
    With a `sql`, `delta` or `iceberg` source it holds the pipeline's records (manifests, validation history,
    reports)."""

    source: FilesSource | SqlSource | DeltaSource | IcebergSource = Field(
        default=FilesSource(), discriminator="kind"
    )
    """Where the rows come from: `files` under `uri` (the default); `sql`, a query on an Airflow
    connection; `delta`, a Delta Lake table's window at its current version; or `iceberg`, an
    Iceberg table's window at its current snapshot. The last three are frozen into
    `snapshots.uri` once per run."""

    feature_store: FeatureStoreSection | None = None
    """Features joined from a Feast feature store as of each row's event time (the rows of
    `source` are the entity rows: keys, time, label); the joined rows are the run's snapshot,
    always frozen into `snapshots.uri`. null: the source's columns are the features."""

    partition: str = "ds={{ ds }}"
    """Sub-path of one run's snapshot, an Airflow template rendered per run (`ds={{ ds }}`)."""

    freeze: bool | Literal["versions"] = False
    """`files` source: `true` copies each run's validated files into the content-addressed snapshot
    store (`snapshots.uri`) and trains on the copies, so an overwritten partition cannot change
    what a model can be reproduced from. `versions` copies nothing: on an `s3://` bucket with
    versioning enabled, the manifest pins each file to the object version it hashed
    (`...?versionId=`), and validation, training and reproduce read that version, whatever is
    written over it later; the bucket's lifecycle rule for noncurrent versions then decides how
    long a model stays reproducible (`snapshots gc` does not touch your bucket). Non-file sources
    are always frozen."""

    format: Literal["parquet", "csv"] = "parquet"
    """File format of the snapshot's files."""

    label: ColumnName
    """Column the model predicts: 0/1 (binary), any class values (multiclass: strings or integers),
    numbers (regression), or graded relevance >= 0 (ranking: 0 is not relevant)."""

    group: ColumnName | None = None
    """`training.task: ranking` only: the query (or session) column. Rows of one group are ranked
    against each other; the holdout keeps whole groups, and the metrics are means over groups."""

    features: FeatureColumns
    """Columns the model reads."""

    holdout: HoldoutSection = HoldoutSection()
    """Holdout split: the rows the gate scores candidate and champion on, read once, at the end."""

    validation: ValidationSection | None = ValidationSection()
    """Validation split, carved from the training rows by the holdout's key: epoch metrics, early
    stopping, `training.restore_best` and tuning trials read it. null: none; the epoch metrics
    then read the holdout, which then both chooses the epoch and judges it (docs/data.md)."""

    shuffle_buffer_rows: PositiveInt = 262_144
    """Training rows shuffled together. Each epoch visits the snapshot's blocks (Parquet row groups,
    CSV files) in a seeded order and fully permutes each run of blocks holding this many rows; a
    rank holds at most two such runs, encoded, whatever the snapshot's size. A snapshot smaller
    than this is shuffled as a whole."""

    encoded_cache_mib: NonNegativeInt = 64
    """Memory per rank for keeping the encoded training rows from one epoch to the next. When all
    of them fit (4 bytes x encoded width x training rows), every rank keeps them after the first
    epoch, and later epochs read and decode nothing; a larger snapshot is read every epoch, with
    memory bounded by `shuffle_buffer_rows`. 0: never keep them."""

    wait: WaitSection = WaitSection()
    """How the pipeline waits for the partition to be complete."""

    window: WindowSection | None = None
    """Train on a rolling window of partitions (one snapshot over all of them); null: the run's
    partition alone. Only the run's partition is waited for and validated against its
    predecessor; earlier ones reuse their validation records (validated then, if they have none)."""

    @model_validator(mode="before")
    @classmethod
    def _sql_waits_for_rows(cls, value: Any) -> Any:
        """A query or a table has no marker file: unless told otherwise, a sql, delta or iceberg
        source waits for one row in the run's window."""
        if not isinstance(value, dict) or not isinstance(value.get("source"), dict):
            return value
        if value["source"].get("kind") not in _FROZEN_KINDS:
            return value
        wait = value.get("wait")
        if wait is None:
            return {**value, "wait": {"marker": None, "min_rows": 1}}
        if isinstance(wait, dict) and "marker" not in wait:
            return {**value, "wait": {"marker": None, "min_rows": 1, **wait}}
        return value

    @model_validator(mode="after")
    def _versions_need_a_versioned_store(self) -> DataSection:
        if self.freeze != "versions":
            return self
        if self.source.kind != "files":
            where, problem = (
                ("freeze",),
                f"{'an' if self.source.kind[0] in 'aeiou' else 'a'} {self.source.kind} source is always "
                "frozen into snapshots.uri; remove freeze",
            )
        elif not self.uri.startswith("s3://"):
            where, problem = (
                ("freeze",),
                "versions pins S3 object versions: data.uri must be an s3:// bucket with versioning; use true to copy",
            )
        else:
            return self
        field_problems([(where, problem)])
        return self

    @model_validator(mode="after")
    def _sql_source_fits(self) -> DataSection:
        kind = self.source.kind
        if kind not in _FROZEN_KINDS:
            return self
        problems: FieldProblems = []
        a_kind = f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
        if self.format != "parquet":
            problems.append(
                (("format",), f"{a_kind} source is exported as parquet; remove format or set parquet")
            )
        if self.wait.marker is not None:
            problems.append(
                (("wait", "marker"), f"{a_kind} source has no marker file; wait for rows with min_rows")
            )
        if self.window is not None and self.window.min_partitions is not None:
            # It was accepted and never checked: a window missing days trained on the rest.
            problems.append(
                (
                    ("window", "min_partitions"),
                    f"{a_kind} source reads the window's rows at once, not partition by partition, so "
                    "missing partitions cannot be counted; remove it (wait.min_rows is the rows the "
                    "run's own partition must have)",
                )
            )
        field_problems(problems)
        return self

    @field_validator("partition")
    @classmethod
    def _valid_template(cls, value: str) -> str:
        if value.startswith("/") or ".." in value.split("/"):
            raise ValueError(f"partition is a relative sub-path without '..', got {value!r}")
        if problem := template_syntax_error(value):
            raise ValueError(f"invalid Airflow template {value!r}: {problem}")
        return value

    @model_validator(mode="after")
    def _label_is_not_a_feature(self) -> DataSection:
        if self.label in self.features.all:
            field_problems([(("label",), f"label column {self.label!r} is also listed as a feature")])
        if self.group is not None and self.group in (self.label, *self.features.all):
            field_problems([(("group",), f"group column {self.group!r} is also the label or a feature")])
        return self

    @property
    def split_key(self) -> str | None:
        """The column the holdout split hashes: the group for ranking (whole queries on one
        side), else `holdout.key_column`."""
        return self.group or self.holdout.key_column

    def validation_split(self) -> ValidationSplit | None:
        """The validation rows every job scores during training (None: `validation: null`)."""
        if self.validation is None:
            return None
        seed = self.holdout.seed if self.validation.seed is None else self.validation.seed
        return ValidationSplit(fraction=self.validation.fraction, seed=seed)

    @model_validator(mode="after")
    def _window_needs_dated_partitions(self) -> DataSection:
        if self.window is not None and renders_one_path(self.partition, self.window.every):
            field_problems(
                [
                    (
                        ("window",),
                        f"partition {self.partition!r} renders the same path for every date, so a "
                        "window would read one partition many times; template it with the date "
                        "(`ds={{ ds }}`)",
                    )
                ]
            )
        return self


def pod_reach_problems(
    data: DataSection, snapshots: SnapshotsSection, training: TrainingSection, tuning: TuningSection | None
) -> FieldProblems:
    """With launcher kubernetes, the pods reach the data, the snapshot store and the study's storage."""
    if training.launcher != "kubernetes":
        return []
    problems = pod_storage_problems(data.uri, training.kubernetes, ("data", "uri"))
    if tuning is not None and tuning.pruning.kind != "none" and tuning.storage_conn_id is None:
        problems.append(
            (
                ("tuning", "storage_conn_id"),
                "a trial's pod reports its rungs to the study: name the connection of a database "
                "the pods reach (the default SQLite file is on the Airflow worker)",
            )
        )
    if data.source.kind != "files" or data.freeze is True:
        problems.extend(pod_storage_problems(snapshots.uri, training.kubernetes, ("snapshots", "uri")))
    return problems


def validation_split_problems(data: DataSection, tuning: TuningSection | None) -> FieldProblems:
    """Tuning trials are scored on the validation split: it cannot be off."""
    if tuning is not None and data.validation is None:
        return [
            (
                ("data", "validation"),
                "tuning trials are scored on the validation split (the gate's holdout must not "
                "choose the candidate it then judges); set data.validation or remove tuning",
            )
        ]
    return []


def holdout_key_problems(data: DataSection) -> FieldProblems:
    """The holdout is not split by the label it predicts."""
    if data.holdout.key_column == data.label:
        return [(("data", "holdout", "key_column"), "the split key cannot be the label column")]
    return []


def ranking_problems(data: DataSection, task: Task) -> FieldProblems:
    """`data.group` exactly when the task ranks, and a ranking holdout split by that group alone."""
    # (training.ranking_loss is not checked: a serialized config carries its default everywhere.)
    if task != "ranking":
        if data.group is not None:
            return [(("data", "group"), f"group applies to task ranking, not {task}")]
    elif data.group is None:
        return [(("data", "group"), "task ranking needs the query column its rows are ranked within")]
    elif data.holdout.key_column not in (None, data.group):
        return [
            (
                ("data", "holdout", "key_column"),
                f"a ranking holdout keeps whole groups, split by data.group {data.group!r}; "
                f"remove key_column {data.holdout.key_column!r}",
            )
        ]
    return []
