-- The MLflow server's backend store lives beside Airflow's metadata database.
CREATE DATABASE mlflow;
