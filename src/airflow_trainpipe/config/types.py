"""Constrained scalar types shared by the config sections."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _parse_duration(value: Any) -> Any:
    """Accept `90s`, `5m`, `1h30m`, `2d` or a number of seconds; leave the rest to pydantic."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 30s, 5m, 1h30m or a number of seconds")
    if isinstance(value, int | float):
        return _timedelta(value, value)
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        negative = text.startswith("-")
        body = text.lstrip("-")
        if body and _DURATION_PART.sub("", body) == "":
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(body))
            return _timedelta(-seconds if negative else seconds, value)
        raise ValueError(f"expected a duration such as 30s, 5m, 1h30m or a number of seconds, got {value!r}")
    return value


def _timedelta(seconds: float, value: Any) -> timedelta:
    try:
        return timedelta(seconds=seconds)
    except (OverflowError, ValueError):  # .inf, .nan, 1.0e+20, 99999999999d: OverflowError is no ValueError
        raise ValueError(f"expected a finite duration of at most 999999999 days, got {value!r}") from None


def format_duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{seconds}s"


def short_duration(value: timedelta) -> str:
    """The largest whole unit, as a config writes it: `1h`, `3d`, `90s` (for messages)."""
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return format_duration(value)


def _non_negative(value: timedelta) -> timedelta:
    if value < timedelta(0):
        raise ValueError(f"a duration cannot be negative, got {format_duration(value)}")
    return value


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError(f"expected a duration greater than zero, got {format_duration(value)}")
    return value


_DURATION_SCHEMA = {
    "anyOf": [
        {"type": "string", "pattern": r"^(\d+(\.\d+)?(ms|s|m|h|d))+$"},
        {"type": "number", "minimum": 0},
    ]
}

Duration = Annotated[
    timedelta,
    BeforeValidator(_parse_duration),
    AfterValidator(_non_negative),
    PlainSerializer(format_duration, return_type=str),
    Field(json_schema_extra=_DURATION_SCHEMA),
]
PositiveDuration = Annotated[Duration, AfterValidator(_positive)]


def _storage_uri(value: str) -> str:
    """`s3://bucket/prefix`, `file:///absolute/path`, or a path relative to TRAINPIPE_HOME."""
    if not value.strip():
        raise ValueError("expected a storage URI, got an empty string")
    if "{{" in value or "{%" in value:
        raise ValueError("storage URIs are not templated; put the per-run part in data.partition")
    parts = urlsplit(value)
    if parts.scheme == "":
        if value.startswith("/"):
            raise ValueError(f"write an absolute local path as a URI: file://{value}")
        return value
    if parts.scheme not in ("file", "s3"):
        raise ValueError(f"unsupported scheme {parts.scheme}://; expected s3://, file:// or a relative path")
    if "@" in parts.netloc or parts.password or parts.query:
        raise ValueError(
            "credentials do not belong in a URI; configure them in an Airflow connection "
            "(aws_default for s3://)"
        )
    if parts.scheme == "s3" and not parts.netloc:
        raise ValueError(f"expected s3://BUCKET/PREFIX, got {value!r}")
    if parts.scheme == "file" and (parts.netloc or not parts.path.startswith("/")):
        raise ValueError(f"expected file:///ABSOLUTE/PATH (three slashes), got {value!r}")
    return value.rstrip("/")


StorageUri = Annotated[
    str,
    AfterValidator(_storage_uri),
    Field(json_schema_extra={"examples": ["s3://bucket/prefix", "file:///data/prefix", "data/prefix"]}),
]

_REGISTERED_VERSION = re.compile(
    r"^models:/(?P<name>[^/@]+)(?:/(?P<version>[0-9]+)|@(?P<alias>[A-Za-z0-9_-]+))$"
)


def registered_version(value: str) -> tuple[str, str | None, str | None] | None:
    """`models:/NAME/VERSION` -> (name, version, None), `models:/NAME@ALIAS` -> (name, None,
    alias); None for anything else."""
    match = _REGISTERED_VERSION.match(value)
    return (match["name"], match["version"], match["alias"]) if match else None


def _pretrained_uri(value: str) -> str:
    if value.startswith("models:"):
        if registered_version(value) is None:
            raise ValueError(
                f"expected models:/NAME/VERSION or models:/NAME@ALIAS (a registered model version), got {value!r}"
            )
        return value
    try:
        return _storage_uri(value)
    except ValueError as exc:
        raise ValueError(f"{exc}; or models:/NAME/VERSION, models:/NAME@ALIAS") from None


PretrainedUri = Annotated[
    str,
    AfterValidator(_pretrained_uri),
    Field(
        json_schema_extra={
            "examples": [
                "s3://bucket/encoders/base",
                "file:///models/encoder",
                "models:/ticket_router@champion",
            ]
        }
    ),
]

# An Airflow pool's name: the API refuses the empty name, the UI links break on other characters.
PoolName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_.-]+$")]

# A column name as it appears in the data files.
ColumnName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\s].*$")]

# Airflow's dag_id rule (KEY_REGEX) with its 250-character limit.
DAG_ID_PATTERN = r"^[A-Za-z0-9_.-]+$"
DAG_ID_MAX_LENGTH = 250
DagId = Annotated[str, Field(min_length=1, max_length=DAG_ID_MAX_LENGTH, pattern=DAG_ID_PATTERN)]

# Airflow refuses longer DAG tags when the DAG is built (airflow.sdk.definitions.dag.TAG_MAX_LEN).
DAG_TAG_MAX_LENGTH = 100
DagTag = Annotated[str, Field(max_length=DAG_TAG_MAX_LENGTH)]

# Kubernetes resource quantity: `2`, `500m`, `16Gi`, `1.5`.
Quantity = Annotated[
    str,
    BeforeValidator(lambda v: str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v),
    Field(pattern=r"^([0-9]+(\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"),
]

# MLflow model alias: letters, digits, _ and -; `latest` and version-like `v3` are reserved.
_ALIAS = re.compile(r"^[A-Za-z0-9_-]{1,255}$")


def _alias(value: str) -> str:
    if not _ALIAS.match(value):
        raise ValueError(f"an MLflow alias may use letters, digits, '_' and '-' only, got {value!r}")
    if value.lower() == "latest" or re.fullmatch(r"[vV]\d+", value):
        raise ValueError(f"{value!r} is reserved by MLflow (latest, v<number>)")
    return value


Alias = Annotated[str, AfterValidator(_alias)]
