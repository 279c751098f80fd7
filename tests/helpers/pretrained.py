"""Small Hugging Face format directories for the tests: the example's, built from a config."""

from airflow_trainpipe.examples.encoder_directory import save_encoder_directory

__all__ = ["save_encoder_directory"]
