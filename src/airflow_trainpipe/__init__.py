"""airflow-trainpipe: YAML-declared ML retrain pipelines as an Apache Airflow provider.

Nothing is imported here on purpose: Airflow loads provider packages in every DAG-processor
and worker process, so this module must stay free of anything heavy.
"""

__version__ = "0.1.0"
