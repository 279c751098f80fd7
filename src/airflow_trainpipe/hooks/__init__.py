"""Airflow hooks: MlflowHook (connection type `mlflow`), the connection and a thin client over
MLflow's.
"""
