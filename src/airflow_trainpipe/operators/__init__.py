"""The pipeline's tasks, one module per task: each reads its input payload, does its one thing, and
returns its payload.
"""
