"""The ground floor: what every other part of the package stands on, and nothing above it.

exceptions (the hierarchy and its `retryable` flag), retry_policy (Airflow reads that flag),
storage (URIs and filesystems), digest (content hashes), processes (child lifetime),
tracking_store (the embedded default MLflow store; MLflow reads are registry/reads.py's).
Light: pydantic-free, no torch, pandas or mlflow at module top; the config imports it at parse time.
"""
