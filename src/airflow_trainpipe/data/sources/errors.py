"""The errors of a source kind: light (stdlib only), so the feature-store client, which runs on
workers without pyarrow or pydantic loaded, can subclass them."""

from __future__ import annotations

from airflow_trainpipe.core.exceptions import TrainpipeError


class SourceError(TrainpipeError):
    """The source cannot give the run's rows: a wrong query, a missing connection, no rows."""


class SourceUnavailable(SourceError):
    """The database could not be reached or dropped the connection: another try may succeed."""

    retryable = True
