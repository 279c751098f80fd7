"""The upstream of test_standalone_postgres's partitioned pipeline: an export job that says which day of
card transactions it landed, as a partition of the `card_transactions_days` asset. (The stack
wrote the files themselves before Airflow started.)"""

from __future__ import annotations

from airflow.sdk import DAG, Asset, Param, PartitionedAtRuntime, task

CARD_TRANSACTION_DAYS = Asset(name="card_transactions_days", uri="file:///e2e/data/card_transactions")

with DAG(
    dag_id="land_card_transactions",
    schedule=PartitionedAtRuntime(),
    params={"day": Param("2026-01-03", type="string")},
    tags=["e2e", "upstream"],
):

    @task(outlets=[CARD_TRANSACTION_DAYS])
    def land(params=None, outlet_events=None):  # type: ignore[no-untyped-def]
        outlet_events[CARD_TRANSACTION_DAYS].add_partitions(params["day"])

    land()
