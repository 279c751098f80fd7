"""What goes wrong with a snapshot: its partition, its files, its store."""

from __future__ import annotations

from airflow_trainpipe.core.exceptions import TrainpipeError


class SnapshotError(TrainpipeError):
    """The partition is missing, holds no data files, or its files disagree with each other."""

    retryable = True  # files may still arrive, a store may recover


class PartitionError(TrainpipeError):
    """A rendered partition that is not a plain sub-path of `data.uri`: retrying cannot fix it."""


class UnversionedError(SnapshotError):
    """`data.freeze: versions` on an object that has no version: retrying cannot version it."""

    retryable = False
