"""The DAG factory: every pipeline config in a folder becomes one retrain DAG.

Runs in the DAG processor at parse time, so it imports only airflow.sdk, pydantic and yaml
(through the config package); operators import their heavy libraries inside `execute()`.
"""

from airflow_trainpipe.factory.pipelines import build_pipeline_dags, register_pipelines

__all__ = ["build_pipeline_dags", "register_pipelines"]
