"""The model after training: the gate's rule, registration, alias moves, the records of decisions, and
the MLflow reads they share.
"""
