"""Snapshot validation: schema contract, volume, Great Expectations and drift.

Runs in the Airflow worker (`DataValidateOperator`); imports pyarrow, numpy, pandas and
great_expectations, so nothing at parse time may import it.
"""
