"""Storage URIs: `s3://...`, `file:///...`, or a path relative to TRAINPIPE_HOME.

Light on purpose (fsspec is imported only when a filesystem is needed): operators use it at
run time, and the runtime inside training processes and pods.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

HOME_ENV = "TRAINPIPE_HOME"


def trainpipe_home() -> Path:
    """Root of relative storage paths: $TRAINPIPE_HOME, else ./var under the working directory."""
    return Path(os.environ.get(HOME_ENV) or Path.cwd() / "var").resolve()


def resolve(uri: str) -> str:
    """An absolute URI for a config value: relative paths land under TRAINPIPE_HOME."""
    if urlsplit(uri).scheme:
        return uri.rstrip("/")
    return (trainpipe_home() / uri).as_uri()


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts if p)])


def is_local(uri: str) -> bool:
    return urlsplit(uri).scheme in ("", "file")


def local_path(uri: str) -> Path:
    """The filesystem path of a file:// URI."""
    if not is_local(uri):
        raise ValueError(f"{uri} is not a local file:// URI")
    return Path(unquote(urlsplit(uri).path)) if uri.startswith("file:") else Path(uri)


def dataset_name(uri: str) -> tuple[str, str]:
    """(namespace, name) of a stored path in OpenLineage's naming: `file` and the absolute path for
    local files, `s3://bucket` and the key for S3, `scheme://authority` and the path otherwise."""
    parts = urlsplit(resolve(uri))
    if parts.scheme == "file":
        return "file", unquote(parts.path)
    if parts.scheme in ("s3", "s3a", "s3n"):
        return f"s3://{parts.netloc}", parts.path.lstrip("/")
    return f"{parts.scheme}://{parts.netloc}", parts.path


def node_local_dir(uri: str, purpose: str) -> Path:
    """This node's own directory for a URI: the URI's path when local, else a stable spot under
    TRAINPIPE_HOME (staged checkpoints, the step high-water mark of an s3:// run)."""
    return local_path(uri) if is_local(uri) else node_scratch_dir(uri, purpose)


def node_scratch_dir(uri: str, purpose: str) -> Path:
    """A directory of this node's under TRAINPIPE_HOME, the same one for the same URI and purpose."""
    import hashlib

    return trainpipe_home() / purpose / hashlib.sha1(uri.encode()).hexdigest()[:16]


def filesystem(uri: str, conn_id: str | None = None) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem for a URI and the path inside it.

    With `conn_id`, credentials and endpoint come from that Airflow connection (what
    ObjectStoragePath uses); without, from the environment (pods, the training runtime).
    """
    from fsspec.core import url_to_fs

    if uri.startswith("file:"):
        # A file:// URI escapes its path (Path.as_uri: "x y" -> "x%20y"); fsspec would not unescape it.
        uri = f"file://{local_path(uri)}"
    fs, path = url_to_fs(uri)
    if conn_id:
        from airflow.sdk.io.fs import get_fs

        fs = get_fs(urlsplit(uri).scheme or "file", conn_id)
    return fs, path
