"""The tasks' extra links in the Airflow UI: from a task to what it left in MLflow."""
