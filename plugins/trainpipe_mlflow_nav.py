"""Airflow plugin: a link to the MLflow UI in the Airflow navigation (Browse menu).

The URL is configuration, never hard-coded: `TRAINPIPE_MLFLOW_UI_URL` if set, else the
`mlflow_default` connection given as `AIRFLOW_CONN_MLFLOW_DEFAULT` (JSON or URI form): its extra
`ui_url`, its http(s) extra `tracking_uri`, or host + port + schema. Without any, no link.
The api-server builds its menu from `external_views` (Airflow 3 replaced `appbuilder_menu_items`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from urllib.parse import parse_qs, unquote, urlsplit

from airflow.plugins_manager import AirflowPlugin

UI_URL_ENV = "TRAINPIPE_MLFLOW_UI_URL"
CONNECTION_ENV = "AIRFLOW_CONN_MLFLOW_DEFAULT"


def _connection_fields(value: str) -> dict:
    if value.lstrip().startswith("{"):
        return json.loads(value)
    parts = urlsplit(value)  # mlflow://host:port/schema?ui_url=...
    extra = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    return {
        "host": parts.hostname,
        "port": parts.port,
        "schema": unquote(parts.path.lstrip("/")),
        "extra": extra,
    }


def mlflow_ui_url(environ: Mapping[str, str] = os.environ) -> str | None:
    if url := environ.get(UI_URL_ENV):
        return url.rstrip("/")
    if not (value := environ.get(CONNECTION_ENV)):
        return None
    fields = _connection_fields(value)
    extra = fields.get("extra") or {}
    if isinstance(extra, str):
        extra = json.loads(extra) if extra else {}
    if url := extra.get("ui_url"):
        return url.rstrip("/")
    tracking = extra.get("tracking_uri") or ""
    if tracking.startswith(("http://", "https://")):
        return tracking.rstrip("/")
    if not (host := fields.get("host")):
        return None
    url = host if "://" in host else f"http://{host}"
    if port := fields.get("port"):
        url += f":{port}"
    if schema := fields.get("schema"):
        url += "/" + schema.strip("/")
    return url


def mlflow_external_views(environ: Mapping[str, str] = os.environ) -> list[dict]:
    url = mlflow_ui_url(environ)
    if url is None:
        return []
    return [{"name": "MLflow", "href": url, "destination": "nav", "category": "browse"}]


class TrainpipeMlflowNavPlugin(AirflowPlugin):
    name = "trainpipe_mlflow_nav"
    external_views = mlflow_external_views()
