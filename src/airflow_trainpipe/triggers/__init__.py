"""Triggers that run in Airflow's triggerer: the polling loop, every source kind's deferrable wait
for data, and a canary step's wait while its share of traffic is judged.
"""
