"""The pretrained directory's own error: a bad directory fails the task at once, never retried."""

from __future__ import annotations

from airflow_trainpipe.core.exceptions import TrainpipeError


class PretrainedError(TrainpipeError):
    """A pretrained directory that cannot be used as it is; the message names its path and why.

    Not retryable: another try reads the same bytes. A store that does not answer (S3, MLflow)
    raises its own error instead, which is retried."""

    retryable = False
