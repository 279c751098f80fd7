"""Typed pipeline configs: parsed once, at the boundary, from safe YAML.

Imports pydantic and yaml only; it runs in the DAG processor, the CLI and training pods.
"""

from airflow_trainpipe.config.loader import CONFIG_SUFFIXES, as_config, load_config, parse_config
from airflow_trainpipe.config.pipeline import PipelineConfig

__all__ = ["CONFIG_SUFFIXES", "PipelineConfig", "as_config", "load_config", "parse_config"]
