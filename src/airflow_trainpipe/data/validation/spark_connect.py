"""The Spark Connect session `validation.engine: spark` runs on: the server's address, the
session's lifetime, and every call's failure classified (a server that went away is retried by
Airflow; a plan it refused is not). pyspark is imported inside the methods: it is the `spark` extra."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from airflow_trainpipe.config.pipeline import PipelineConfig
from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.core.storage import is_local, local_path

# Client-side retries of one call: ~4.5 s of backoff (50 ms x4 each time) before a server that
# does not answer is reported; pyspark's default retries for ten minutes, inside the task. Beyond
# this, the task's own retries (minutes apart) take over.
CALL_RETRIES = 4


# gRPC statuses of a connection that failed, rather than of a request the server refused
CONNECTION_LOST = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED")


class SparkEngineError(TrainpipeError):
    """The Spark engine cannot validate the snapshot: no address, no pyspark, a file the server
    cannot read."""


class SparkUnavailable(SparkEngineError):
    """The Spark Connect server could not be reached or went away: another try may succeed."""

    retryable = True


def spark_remote(config: PipelineConfig) -> str:
    """The Spark Connect address: `validation.spark_remote`, else the worker's SPARK_REMOTE."""
    remote = config.validation.spark_remote or os.environ.get("SPARK_REMOTE", "")
    if not remote.startswith("sc://"):
        raise SparkEngineError(
            f"pipeline {config.pipeline}: validation.engine spark needs a Spark Connect address "
            f"sc://HOST:PORT in validation.spark_remote or the SPARK_REMOTE environment variable"
            + (f" (SPARK_REMOTE is {remote!r})" if remote else "")
        )
    return remote


def spark_uri(uri: str) -> str:
    """A snapshot file's URI as Hadoop reads it: local paths unescaped (file:// URIs escape a
    space as %20, which Hadoop would escape again), s3:// through the s3a connector."""
    if is_local(uri):
        return f"file://{local_path(uri)}"
    parts = urlsplit(uri)
    return uri.replace("s3://", "s3a://", 1) if parts.scheme == "s3" else uri


class SparkConnect:
    """A Spark Connect session for one validation: opened against the address, probed once,
    released at the end (`with`). Errors name the pipeline, the engine and the address."""

    def __init__(self, config: PipelineConfig) -> None:
        self.pipeline = config.pipeline
        self.remote = spark_remote(config)
        self.session: Any = None

    def __enter__(self) -> SparkConnect:
        try:
            from pyspark.sql import SparkSession as PySparkSession
            from pyspark.sql.connect.client.retries import DefaultPolicy
        except ImportError as exc:
            raise SparkEngineError(
                f"pipeline {self.pipeline}: validation.engine spark needs pyspark with Spark Connect "
                f"in the worker: pip install 'airflow-trainpipe[spark]' ({exc})"
            ) from exc
        # The classic builder, not pyspark.sql.connect's: it switches pyspark.sql.functions (which
        # GX's Spark metrics call) to their Connect implementation.
        self.session = PySparkSession.builder.remote(self.remote).create()
        self.session.client.set_retry_policies([DefaultPolicy(max_retries=CALL_RETRIES)])
        try:
            self.probe()
        except TrainpipeError as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)  # `with` calls it only after a good start
            raise
        return self

    def probe(self) -> None:
        """One round trip; raises SparkUnavailable when the server does not answer."""
        try:
            self.session.version  # noqa: B018 (a call to the server)
        except Exception as exc:
            raise self.unavailable(exc) from exc

    def unavailable(self, exc: BaseException) -> TrainpipeError:
        """SparkUnavailable for a connection-level failure (gRPC UNAVAILABLE, a deadline), else
        SparkEngineError: a server that answers and refuses (a bad token) will refuse again."""
        status = getattr(exc, "getGrpcStatusCode", lambda: None)()
        cause = exc.__cause__ or exc.__context__
        # pyspark's gRPC error has no message of its own: the detail is on the RpcError it wraps
        details = getattr(cause, "details", None)
        detail = str(exc) or (str(details()) if callable(details) else repr(cause))
        name = getattr(status, "name", None) or type(exc).__name__
        where = (
            f"pipeline {self.pipeline}: validation.engine spark: the Spark Connect server at {self.remote}"
        )
        if name in CONNECTION_LOST:
            return SparkUnavailable(f"{where} cannot be reached ({name}: {detail}); another try may succeed")
        return SparkEngineError(f"{where} refused the session ({name}: {detail})")

    def __exit__(self, *exc_info: object) -> None:
        if self.session is None:
            return
        if isinstance(exc_info[1], SparkUnavailable):
            # Releasing the session needs the server too: close the channel only.
            self.session.release_session_on_close = False
        self.session.stop()

    def read(self, uris: list[str]) -> Any:
        """A DataFrame of exactly these files (never their folder); lazy, as plans are."""
        return self.session.read.parquet(*[spark_uri(u) for u in uris])

    def collect(self, frame: Any, doing: str) -> list[Any]:
        """Run a plan and fetch its (small) result; a failure names what was being done."""
        try:
            return list(frame.collect())
        except Exception as exc:
            raise self.failure(exc, doing) from exc

    def arrow(self, frame: Any, doing: str) -> Any:
        """Run a plan and fetch its result as an Arrow table (no Python object per value)."""
        try:
            return frame.toArrow()
        except Exception as exc:
            raise self.failure(exc, doing) from exc

    def failure(self, exc: BaseException, doing: str) -> TrainpipeError:
        """A failed plan: the server gone (retryable), else the server's own error, which another
        try would meet again (a file it cannot read, a missing column)."""
        status = getattr(exc, "getGrpcStatusCode", lambda: None)()
        if getattr(status, "name", None) in CONNECTION_LOST:
            return self.unavailable(exc)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return SparkEngineError(
            f"pipeline {self.pipeline}: validation.engine spark: the Spark Connect server at "
            f"{self.remote} failed {doing} ({type(exc).__name__}: {first}); it reads the snapshot "
            "store itself (s3:// as s3a://: see docs/data.md)"
        )
