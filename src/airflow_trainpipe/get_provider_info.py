"""Provider metadata, read by Airflow through the `apache_airflow_provider` entry point.

Operators, sensors, hooks, triggers and connection types are listed here as they are added
to the package; tests/test_get_provider_info.py checks every listed module imports and that
the dict validates against Airflow's own provider_info schema.
"""

from __future__ import annotations

from airflow_trainpipe import __version__


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-trainpipe",
        "name": "Trainpipe",
        "description": (
            "YAML-declared ML retrain pipelines: wait for data, validate it (Great Expectations "
            "and drift), train with DeepSpeed ZeRO (torchrun locally or Kubernetes pods), gate "
            "the candidate against the production champion and register it in MLflow."
        ),
        "versions": [__version__],
        "operators": [
            {
                "integration-name": "Trainpipe",
                "python-modules": [
                    "airflow_trainpipe.operators.train",
                    "airflow_trainpipe.operators.validate",
                    "airflow_trainpipe.operators.gate",
                    "airflow_trainpipe.operators.register",
                    "airflow_trainpipe.operators.approval",
                    "airflow_trainpipe.operators.promote",
                    "airflow_trainpipe.operators.canary",
                    "airflow_trainpipe.operators.tune",
                    "airflow_trainpipe.operators.config_error",
                ],
            },
        ],
        "sensors": [
            {"integration-name": "Trainpipe", "python-modules": ["airflow_trainpipe.sensors.snapshot"]},
        ],
        "triggers": [
            {
                "integration-name": "Trainpipe",
                "python-modules": [
                    "airflow_trainpipe.triggers.source_rows",
                    "airflow_trainpipe.triggers.canary_step",
                ],
            },
        ],
        "hooks": [
            {"integration-name": "Trainpipe", "python-modules": ["airflow_trainpipe.hooks.mlflow"]},
        ],
        "connection-types": [
            {
                "connection-type": "mlflow",
                "hook-class-name": "airflow_trainpipe.hooks.mlflow.MlflowHook",
                "hook-name": "MLflow",
            },
        ],
        "notifications": ["airflow_trainpipe.notifications.email.PipelineEmailNotifier"],
        "extra-links": [
            "airflow_trainpipe.links.mlflow.MlflowRunLink",
            "airflow_trainpipe.links.mlflow.MlflowModelVersionLink",
            "airflow_trainpipe.links.mlflow.GateReportLink",
            "airflow_trainpipe.links.mlflow.CanaryReportLink",
        ],
        "integrations": [
            {
                "integration-name": "Trainpipe",
                "external-doc-url": "https://github.com/airflow-trainpipe/airflow-trainpipe",
                "tags": ["software"],
            }
        ],
    }
