# Airflow image: Apache Airflow 3.3 with this provider (its DAG factory, operators, validation).
#   docker build -f docker/airflow.Dockerfile -t trainpipe-airflow:0.1.0 .
ARG AIRFLOW_IMAGE=apache/airflow:3.3.2-python3.12
FROM ${AIRFLOW_IMAGE}

# The official image's non-root `airflow` user (uid 50000) installs into its user site.
USER 50000
COPY --chown=50000:0 pyproject.toml constraints.txt README.md /opt/trainpipe/
COPY --chown=50000:0 src /opt/trainpipe/src
# The CPU torch wheel: Airflow workers only launch training (local launcher for small jobs,
# pods for GPU jobs); constraints.txt keeps every other version as tested.
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
        --constraint /opt/trainpipe/constraints.txt /opt/trainpipe
