"""Read every config of a folder, each parsed once per content: a content-hash cache.

The DAG processor parses the loader file in a fresh process every `min_file_process_interval`,
so an in-memory cache alone would never hit; validated configs are also kept on disk, keyed by
the sha256 of the file's text and of the config package's own source (a code change must not
serve an entry validated by older rules). Entries are JSON and are validated again on load:
a cache directory someone else can write to must never be a way to run code (no pickle).

Whatever sits in the folder, each entry ends as a parsed config or as an error naming it:
a failure (an unreadable folder, a hostile file, a bug) is never an exception out of here,
and a failure is never cached.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pydantic
from pydantic import ValidationError

from airflow_trainpipe.config import CONFIG_SUFFIXES, PipelineConfig, parse_config
from airflow_trainpipe.config.files import printable_name, read_config_text
from airflow_trainpipe.core.exceptions import ConfigError, ConfigProblem

log = logging.getLogger(__name__)

CACHE_ENV = "TRAINPIPE_CONFIG_CACHE"
"""Directory of the parsed-config cache; `off` disables it."""

# Parsed in this process already (dag.test(), a worker): no disk read at all.
_memory: dict[str, PipelineConfig] = {}


@dataclass(frozen=True)
class ConfigFile:
    """One config file of the folder: its parsed config, or the error that stops it."""

    path: Path
    name: str  # as users see it: relative to the dags folder when inside it
    config: PipelineConfig | None = None
    error: ConfigError | None = None


def read_config_folder(folder: Path, display_root: Path | None = None) -> list[ConfigFile]:
    """Every `*.yaml` / `*.yml` of `folder` (sorted, hidden files skipped), parsed or failed.

    Entries that are not regular files (a directory named `x.yaml`, a FIFO, a broken symlink)
    are listed too: each fails naming what it is, rather than vanishing without a word.
    """
    cache_dir = cache_directory()
    try:
        files = (
            sorted(
                p
                for p in folder.iterdir()
                if p.suffix in CONFIG_SUFFIXES and not p.name.startswith((".", "_"))
            )
            if folder.is_dir()
            else []
        )
    except OSError as exc:
        name = _display_name(folder, display_root)
        return [
            ConfigFile(
                folder,
                name,
                error=ConfigError(
                    [ConfigProblem(name, None, None, "", f"cannot list the folder: {exc.strerror or exc}")]
                ),
            )
        ]
    return [_read(path, _display_name(path, display_root), cache_dir) for path in files]


def cache_directory() -> Path | None:
    setting = os.environ.get(CACHE_ENV)
    if setting == "off":
        return None
    if setting:
        return Path(setting)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "airflow-trainpipe" / "configs"


def _display_name(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return printable_name(path.relative_to(root).as_posix())
        except ValueError:
            pass
    return printable_name(path)


def _read(path: Path, name: str, cache_dir: Path | None) -> ConfigFile:
    try:
        return _read_cached(path, name, cache_dir)
    except Exception as exc:  # a bug of ours: only this file pays for it
        log.error("reading pipeline config %s failed unexpectedly", name, exc_info=exc)
        return ConfigFile(path, name, error=ConfigError.unexpected(name, "reading it", exc))


def _read_cached(path: Path, name: str, cache_dir: Path | None) -> ConfigFile:
    try:
        text = read_config_text(path, source=name)
    except ConfigError as exc:
        return ConfigFile(path, name, error=exc)
    key = hashlib.sha256(text.encode() + _code_fingerprint()).hexdigest()
    config = _memory.get(key) or _from_disk(cache_dir, key)
    if config is None:
        try:
            config = parse_config(text, source=name)
        except ConfigError as exc:
            return ConfigFile(path, name, error=exc)
        _to_disk(cache_dir, key, config)
    _memory[key] = config
    return ConfigFile(path, name, config=config)


def _from_disk(cache_dir: Path | None, key: str) -> PipelineConfig | None:
    if cache_dir is None:
        return None
    try:
        return PipelineConfig.model_validate_json((cache_dir / f"{key}.json").read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError, ValueError) as exc:
        # A damaged entry is only a miss: the YAML is the source of truth.
        log.debug("ignoring config cache entry %s: %s", key, exc)
        return None


def _to_disk(cache_dir: Path | None, key: str, config: PipelineConfig) -> None:
    if cache_dir is None:
        return
    try:
        cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = cache_dir / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(config.model_dump_json(by_alias=True), encoding="utf-8")
        os.replace(tmp, cache_dir / f"{key}.json")  # readers never see half an entry
    except OSError as exc:
        log.debug("config cache %s not writable: %s", cache_dir, exc)  # a read-only home only costs speed


@cache
def _code_fingerprint() -> bytes:
    """The config rules in force: the config package's source, pydantic and Python versions."""
    digest = hashlib.sha256(f"{pydantic.VERSION}|{sys.version_info[:2]}".encode())
    package = Path(__file__).resolve().parent.parent / "config"
    for source in sorted(package.glob("*.py")):
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    return digest.digest()
