"""Deprecated: moved to `airflow_trainpipe.core.retry_policy` in the architecture pass of 2026-11-26.

DAG files wrote `from airflow_trainpipe.retry_policy import ...` (a `retry_policy` in `default_args`, an
exception a callback catches); the names still resolve here, with a DeprecationWarning naming the
new path. To be removed in 0.3.
"""

from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    from airflow_trainpipe.core import retry_policy

    value = getattr(retry_policy, name)  # AttributeError for a name that never was there
    warnings.warn(
        f"airflow_trainpipe.retry_policy.{name} moved to airflow_trainpipe.core.retry_policy.{name}",
        DeprecationWarning,
        stacklevel=2,
    )
    return value
